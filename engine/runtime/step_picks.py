"""A step's picked tokens left on the device (async scheduling): the next step's inputs read
them there, and the host reads them back once, without waiting for the step after.

Under async scheduling the engine launches step t + 1 before it reads step t's tokens. So
step t's picks stay tensors: `tokens` [rows] on the device, which step t + 1's input gathers
from; and a copy of (token, log probability) per row into pinned host memory, queued behind step
t's work with an event after it, so that `result()` waits for step t alone, not for the step the
engine has launched since (a plain `.tolist()` would wait for everything on the stream).
"""

from __future__ import annotations

import torch


class StepPicks:
    """Per row of a step: the picked token (on the device) and its log probability; `result()`
    gives (token, log prob) for each of `draw_rows`, in order."""

    def __init__(self, tokens: torch.Tensor, logprobs: torch.Tensor, draw_rows: list[int]) -> None:
        self.tokens = tokens  # int64 [rows], where the next step's inputs read
        self.logprobs = logprobs
        self.draw_rows = draw_rows
        both = torch.stack([tokens.double(), logprobs.double()])  # ids are exact in float64
        if tokens.device.type == "cuda":
            self._host = torch.empty(both.shape, dtype=both.dtype, pin_memory=True)
            self._host.copy_(both, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:
            self._host, self._done = both, None

    def result(self) -> list[tuple[int, float]]:
        if self._done is not None:
            self._done.synchronize()  # this step's work only: the next one keeps running
        ids, lps = self._host.tolist()
        return [(int(ids[r]), lps[r]) for r in self.draw_rows]
