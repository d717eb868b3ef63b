"""A tensor-parallel step's scores: worker 0 holds the logits, the engine asks for what it needs.

Every step's greedy pick per row comes back in worker 0's reply (16 bytes a row), read when the
engine first needs it: at once, or, under async scheduling, when the step lands after the next
one was sent. The full logits cross the wire only when a request of the step samples or
searches beams, then once for the whole step, and are wrapped in the one-process `TorchScores`
for the draw.

Under async scheduling a step's greedy picks also stay on every worker: `pick_rows` hands the
engine a `WorkerTokens` handle, and the next step's message names the rows to read there
instead of the tokens. A sampled draw happens here, so its tokens are on the host and the next
step sends them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from engine.runtime.sampler import TorchScores


class StepReply:
    """Worker 0's reply to one step: each row's (greedy token, log probability), read once."""

    def __init__(self, read: Callable[[], bytes]) -> None:
        self._read = read
        self._pairs: list[tuple[int, float]] | None = None

    def pairs(self) -> list[tuple[int, float]]:
        if self._pairs is None:
            values = np.frombuffer(self._read(), dtype=np.float64).reshape(-1, 2).tolist()
            self._pairs = [(int(t), lp) for t, lp in values]
            self._read = None  # the reply is read: nothing left to hold
        return self._pairs


class WorkerTokens:
    """Where a step's picked tokens are for the step after it: kept by every worker (their
    picks of step `step`), or on the host (`host`: row -> token, a sampled draw)."""

    def __init__(self, step: int, host: dict[int, int] | None = None) -> None:
        self.step, self.host = step, host


class RemotePicks:
    """The `Picks` contract for a tensor-parallel step: `tokens` says where the next step
    finds them, `result()` reads worker 0's reply (or gives the host's draw)."""

    def __init__(self, tokens: WorkerTokens, result: Callable[[], list[tuple[int, float]]]) -> None:
        self.tokens = tokens
        self._result = result

    def result(self) -> list[tuple[int, float]]:
        return self._result()


class RemoteScores:
    """A step's scores when worker 0 holds the logits (the `Scores` contract of
    engine/runtime/protocols.py). `overlap`: the engine schedules asynchronously, so greedy
    picks may stay on the workers for the next step (`can_overlap`)."""

    has_argmax = True  # a greedy row is its argmax: it draws no uniform

    def __init__(self, reply: StepReply, rows: int, fetch: Any, step: int,
                 overlap: bool = False) -> None:
        self._reply = reply
        self.num_rows = rows
        self._fetch, self._step = fetch, step
        self.can_overlap = overlap
        self._full: TorchScores | None = None

    def full(self) -> TorchScores:
        if self._full is None:
            self._full = TorchScores(self._fetch(self._step, self.num_rows))
        return self._full

    @property
    def logits(self) -> torch.Tensor:
        return self.full().logits

    def logprobs(self) -> torch.Tensor:
        return self.full().logprobs()

    def accepted(self, index: int) -> int | None:
        """The workers' picks come back as tokens: the host compares a draft with them."""
        return None

    def greedy(self, row: int) -> tuple[int, float]:
        return self._reply.pairs()[row]

    def sample_many(self, requests: list[Any]) -> list[tuple[int, float]]:
        if all(r.params.temperature == 0 for r in requests):
            pairs = self._reply.pairs()  # no logits need to cross the wire
            return [pairs[r.row] for r in requests]
        return self.full().sample_many(requests)

    def pick_rows(self, requests: list[Any]) -> RemotePicks:
        """`sample_many`, read when the step lands: greedy picks stay on the workers for the
        next step; a sampled draw is made now, on the host."""
        if all(r.params.temperature == 0 for r in requests):
            return RemotePicks(WorkerTokens(self._step), lambda: self.sample_many(requests))
        picks = self.sample_many(requests)
        host = {r.row: t for r, (t, _) in zip(requests, picks, strict=True)}
        return RemotePicks(WorkerTokens(self._step, host), lambda: picks)

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        return self.full().top_many(rows, ks)

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        return self.full().top(row, k)
