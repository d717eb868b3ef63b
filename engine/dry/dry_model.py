"""The dry mode's stand-in for a model: seeded random next-token scores, no tensors.

Serving in dry mode (huge pools, fast tests, the naive-vs-paged comparison) still needs a next
token for every sequence and candidates for beam search. They come from a seeded RNG over the
dry alphabet, so a replay draws the same ones. Labelled dry in the UI: no model ran.
"""

from __future__ import annotations

import math
import random

from engine.core.sampler_keys import SampleRequest
from engine.dry.byte_tokenizer import DRY_ALPHABET
from engine.runtime.protocols import HostPicks

DryPicks = HostPicks  # the dry mode's picks: drawn now (no device), read when the step lands


class DryScores:
    """Next-token scores for a batch of rows, drawn from a seeded RNG (the `Scores` contract of
    engine/runtime/protocols.py). Async scheduling overlaps dry steps too: the picks are drawn
    at once and read when the step lands, as a device's would be."""

    can_overlap = True
    has_argmax = False  # no model: greedy rows draw at their uniform like sampled ones

    def __init__(self, num_rows: int, rng: random.Random) -> None:
        self.num_rows = num_rows
        self.rng = rng

    def sample_many(self, requests: list[SampleRequest]) -> list[tuple[int, float]]:
        """One token per request from its uniform `u` (the same counter the model path uses)."""
        n = len(DRY_ALPHABET)
        lp = -math.log(n)
        return [(DRY_ALPHABET[int(r.u * n)], lp) for r in requests]

    def pick_rows(self, requests: list[SampleRequest]) -> DryPicks:
        """`sample_many` for async scheduling: read when the step lands."""
        return DryPicks(self.sample_many(requests))

    def greedy(self, row: int) -> None:
        """The dry mode has no most likely token (a primitive then leaves no pending token)."""
        return None

    def accepted(self, index: int) -> int | None:
        """No device: the host compares a draft with its picks."""
        return None

    def top_many(self, rows: list[int], ks: list[int]) -> list[list[tuple[int, float]]]:
        return [self.top(row, k) for row, k in zip(rows, ks, strict=True)]

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        tokens = self.rng.sample(DRY_ALPHABET, min(k, len(DRY_ALPHABET)))
        lps = sorted((math.log(self.rng.uniform(0.01, 1.0) / len(DRY_ALPHABET)) for _ in tokens),
                     reverse=True)
        return list(zip(tokens, lps, strict=True))
