"""The sampler's full-vocabulary scratch tensors, kept from one step to the next.

A CPU pays more for faulting in a fresh [256, 49152] float32 tensor (50 MB of new pages) than
for the arithmetic done on it, so the torch path of a draw takes its temporaries from here.
"""

from __future__ import annotations

import math
import weakref

import torch

from engine.runtime.step_picks import PinnedPairs


class SamplerWorkspace:
    """Full-vocabulary scratch tensors kept from one step to the next. On a CPU every new
    [256, 49152] float32 tensor is 50 MB of fresh pages, and faulting them in costs more than
    the arithmetic done on them. Owned by whatever makes the steps' scores (the model runner)
    and used by one step's scores at a time: `owns(scores)` says whether the tensors in it now
    are that scores object's, so a stale one never trusts what it left there. The owner is held
    weakly: a strong reference would close a cycle (scores -> workspace -> scores) that only
    the garbage collector could free, and the buffers with it."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self._owner: weakref.ref | None = None
        self.pinned_picks = PinnedPairs()  # where steps' picks come back to the host, in turn

    def owns(self, scores: object) -> bool:
        return self._owner is not None and self._owner() is scores

    def take(self, scores: object) -> None:
        """`scores` writes into the buffers now: what another scores object left is gone."""
        self._owner = weakref.ref(scores)

    def release(self) -> None:
        """Let go of every buffer now (the runner closes)."""
        self._buffers.clear()
        self._owner = None
        self.pinned_picks = PinnedPairs()

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
        """Buffer `name` viewed as `shape` (uninitialised); grown, never shrunk."""
        n = math.prod(shape)
        key = (name, dtype, torch.device(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = torch.empty(n, dtype=dtype, device=device)
        return buf[:n].view(shape)


def scratch(workspace: SamplerWorkspace | None, name: str, like: torch.Tensor,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    """A temporary shaped like `like`: from the workspace when there is one, else fresh."""
    dtype = dtype or like.dtype
    if workspace is None:
        return torch.empty(like.shape, dtype=dtype, device=like.device)
    return workspace.get(name, tuple(like.shape), dtype, like.device)

