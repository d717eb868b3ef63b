"""The wire between the engine and its tensor-parallel workers: torch.distributed, nothing else.

Three kinds of process group, all meeting through one FileStore in a private temporary folder
(no port open to the network):

- "ctl": gloo, the engine (rank 0) and the N workers (ranks 1..N). Every step the engine
  broadcasts one message (the step's tokens, positions, block tables, copy and swap lists) to
  all workers: a pickled object sent as two broadcasts (its length, then its bytes), as
  torch.distributed.broadcast_object_list does.
- "reply{r}": gloo, the engine and worker r only. Worker 0 sends the logits back on it; worker
  r sends its slice of a block when the inspector asks.
- "tp": the workers only (gloo on CPU, NCCL on CUDA): the two all-reduces of every layer.

The engine process never joins the default process group (it may hold several engines, one per
app session); it uses the process-group objects directly. Waiting on the engine's side polls,
so a dead or stuck worker turns into an error within a bounded time instead of a hang.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

Waiter = Callable[[Any, str], None]  # (a Work, what it is for) -> returns when the work is done


def gloo_group(store: Any, name: str, rank: int, size: int, timeout_s: float) -> Any:
    """A gloo process group of `size` ranks that meet under `name` in `store` (blocks until all
    of them have joined). It listens on the loopback interface only: the workers run on this
    machine, and nothing from the network may reach the pickled messages."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size, options)


def blocking_wait(work: Any, what: str) -> None:
    """The workers' waiter: block (gloo's own timeout bounds it)."""
    work.wait()


def broadcast_object(group: Any, obj: Any, root: int, rank: int, wait: Waiter = blocking_wait
                     ) -> tuple[Any, int]:
    """Send `obj` from `root` to every rank of `group`; returns (the object, its size in bytes
    on the wire)."""
    if rank == root:
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        size = torch.tensor([len(payload)], dtype=torch.int64)
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    wait(group.broadcast(size, root), "message length")
    if rank != root:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    wait(group.broadcast(data, root), "message")
    if rank == root:
        return obj, len(payload)
    return pickle.loads(data.numpy().tobytes()), int(size.item())


class PollingWaiter:
    """The engine's waiter: polls a work while checking that every worker is alive, and gives up
    after `timeout_s`. `check()` raises when a worker died (it names the worker)."""

    def __init__(self, check: Callable[[], None], timeout_s: float) -> None:
        self.check = check
        self.timeout_s = timeout_s

    def __call__(self, work: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        spins = 0
        while not work.is_completed():
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tensor-parallel workers did not answer within "
                                   f"{self.timeout_s:g} s (waiting for the {what})")
            spins += 1
            # a step on a GPU answers in well under a millisecond: spin briefly, then sleep
            time.sleep(0 if spins < 200 else 0.0005)
        work.wait()  # raises if the transfer failed (e.g. a worker's connection closed)
