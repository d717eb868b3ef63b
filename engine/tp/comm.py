"""The workers' own process group: the all-reduces of every layer.

On CUDA the workers join NCCL's default group (one GPU per rank); on a CPU they make a gloo
group, which listens on the loopback interface only: the workers run on this machine, and
nothing from the network may reach them. The engine process joins no group at all: it talks to
the workers through shared memory (engine/tp/link.py), so it may hold several engines, one per
app session.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist


def gloo_group(store: Any, name: str, rank: int, size: int, timeout_s: float) -> Any:
    """A gloo process group of `size` ranks that meet under `name` in `store` (blocks until all
    of them have joined), on the loopback interface."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, options)
