"""A tensor-parallel step's scores: worker 0 holds the logits, the engine asks for what it needs.

Every step's greedy pick per row comes with the step's reply (16 bytes a row); the full logits
cross the wire only when a request of the step samples or searches beams, then once for the
whole step, and are wrapped in the one-process `TorchScores` for the draw.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.runtime.protocols import HostPicks
from engine.runtime.sampler import TorchScores


class RemoteScores:
    """A step's scores when worker 0 holds the logits: the greedy pick of every row came with
    the step; the full logits cross the wire only for a row that samples or searches beams
    (then once for the whole step). The `Scores` contract of engine/runtime/protocols.py."""

    can_overlap = False  # the picks come back over the wire: the host has them at once
    has_argmax = True  # a greedy row is its argmax: it draws no uniform

    def __init__(self, greedy: list[tuple[int, float]], fetch: Any, step: int) -> None:
        self._greedy = greedy
        self.num_rows = len(greedy)
        self._fetch, self._step = fetch, step
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
        return self._greedy[row]

    def sample_many(self, requests: list[Any]) -> list[tuple[int, float]]:
        if all(r.params.temperature == 0 for r in requests):
            return [self._greedy[r.row] for r in requests]  # no logits need to cross the wire
        return self.full().sample_many(requests)

    def pick_rows(self, requests: list[Any]) -> HostPicks:
        """`sample_many`, read now: nothing of a step stays on a device of this process."""
        return HostPicks(self.sample_many(requests))

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        return self.full().top_many(rows, ks)

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        return self.full().top(row, k)
