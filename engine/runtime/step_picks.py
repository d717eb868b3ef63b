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


class PinnedPairs:
    """Pinned host buffers (int64 ids, float32 log probs) that steps' picks copy into, in turn:
    a pair is handed out again once the picks that had it were read. A fresh pinned tensor and
    the stacking of both into float64 cost 0.12-0.28 ms of host a step (run 62, an H100's host,
    32 and 256 rows); this is two copies and an event."""

    def __init__(self) -> None:
        self._free: list[tuple[torch.Tensor, torch.Tensor]] = []

    def take(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        for i, (ids, _) in enumerate(self._free):
            if ids.numel() >= rows:
                return self._free.pop(i)
        size = max(rows, 64)
        return (torch.empty(size, dtype=torch.long, pin_memory=True),
                torch.empty(size, dtype=torch.float32, pin_memory=True))

    def give(self, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._free.append(pair)


class StepPicks:
    """Per row of a step: the picked token (on the device) and its log probability; `result()`
    gives (token, log prob) for each of `draw_rows`, in order."""

    def __init__(self, tokens: torch.Tensor, logprobs: torch.Tensor, draw_rows: list[int],
                 pinned: PinnedPairs | None = None) -> None:
        self.tokens = tokens  # int64 [rows], where the next step's inputs read
        self.logprobs = logprobs
        self.draw_rows = draw_rows
        self._read: list[tuple[int, float]] | None = None
        self._pinned = pinned
        self._pair: tuple[torch.Tensor, torch.Tensor] | None = None
        if tokens.device.type == "cuda":
            m = tokens.shape[0]
            self._pair = (pinned or PinnedPairs()).take(m)
            self._host = (self._pair[0][:m], self._pair[1][:m])
            self._host[0].copy_(tokens, non_blocking=True)
            self._host[1].copy_(logprobs, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()
        else:
            self._host, self._done = (tokens, logprobs), None

    def result(self) -> list[tuple[int, float]]:
        if self._read is None:
            if self._done is not None:
                self._done.synchronize()  # this step's work only: the next one keeps running
            ids, lps = self._host[0].tolist(), self._host[1].tolist()
            self._read = [(ids[r], lps[r]) for r in self.draw_rows]
            if self._pinned is not None and self._pair is not None:  # read: its buffers are free
                self._pinned.give(self._pair)
            self._host, self._pair = (), None
        return self._read
