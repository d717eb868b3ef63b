"""The dry mode's stand-in for a model: seeded random next-token scores, no tensors.

Serving in dry mode (huge pools, fast tests, the naive-vs-paged comparison) still needs a next
token for every sequence and candidates for beam search. They come from a seeded RNG over the
dry alphabet, so a replay draws the same ones. Labelled dry in the UI: no model ran.
"""

from __future__ import annotations

import math
import random

from engine.byte_tokenizer import DRY_ALPHABET
from engine.sequence import SamplingParams


class DryScores:
    """Next-token scores for a batch of rows, drawn from a seeded RNG."""

    def __init__(self, num_rows: int, rng: random.Random) -> None:
        self.num_rows = num_rows
        self.rng = rng

    def sample(self, row: int, params: SamplingParams, generator: random.Random) -> tuple[int, float]:
        return generator.choice(DRY_ALPHABET), -math.log(len(DRY_ALPHABET))

    def top(self, row: int, k: int) -> list[tuple[int, float]]:
        tokens = self.rng.sample(DRY_ALPHABET, min(k, len(DRY_ALPHABET)))
        lps = sorted((math.log(self.rng.uniform(0.01, 1.0) / len(DRY_ALPHABET)) for _ in tokens),
                     reverse=True)
        return list(zip(tokens, lps, strict=True))

    def make_generator(self, seed: int) -> random.Random:
        return random.Random(seed)
