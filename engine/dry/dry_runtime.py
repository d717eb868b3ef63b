"""The dry mode's runtime: the `ModelRuntime` contract (engine/runtime/protocols.py) with no model
and no tensors, so the engine drives the dry mode exactly as it drives a model and never asks
which it has.

What stands in for the model: the byte tokenizer (one token per UTF-8 byte), and one seeded RNG
for everything a model would decide. A primitive's decode step writes a token drawn from it
(`primitive_token`), and a serving step's scores draw from it (`DryScores`: picks at each
request's uniform number, beam candidates from the RNG). A replay of the same op log on the same
seed draws the same tokens. Copies have no bytes to move; a checkpoint saves the one thing this
runtime holds that a later step reads, the RNG's state (`save_blocks`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from engine.config import EngineConfig
from engine.core.kv_groups import KVCacheGroup, dry_groups
from engine.dry.byte_tokenizer import DRY_ALPHABET, ByteTokenizer
from engine.dry.dry_model import DryScores
from engine.runtime.protocols import Feed, StepItem

NO_TENSORS = "the dry mode has no K/V tensors to inspect; load a model"


class DryRuntime:
    """The `ModelRuntime` of the dry mode: bookkeeping only, tokens from a seeded RNG."""

    loaded = None  # no model
    num_layers = 0  # and so no K/V to read
    eos_token_ids: tuple[int, ...] = ()

    def __init__(self, config: EngineConfig) -> None:
        if config.num_gpu_blocks is None:  # EngineConfig refuses it too; said for a direct caller
            raise ValueError("the dry mode needs num_gpu_blocks (there is no memory to size from)")
        self.tokenizer = ByteTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.num_gpu_blocks = config.num_gpu_blocks
        self.max_model_len = config.num_gpu_blocks * config.block_size
        # a stand-in for a hybrid model: a sliding group beside the full one (config.sliding_window)
        self.kv_cache_groups: tuple[KVCacheGroup, ...] = dry_groups(config.sliding_window)
        self.rng = random.Random(config.seed)
        self._closed = False

    def primitive_token(self, pending_token: int | None) -> int:
        """No model picked a pending token: the decode step's token is drawn now."""
        return self.rng.choice(DRY_ALPHABET)

    def execute(self, items: Sequence[StepItem], feed: Feed | None = None) -> DryScores:
        """Nothing to compute: scores for each item's rows of logits, drawn from the RNG."""
        return DryScores(sum(it.num_logits for it in items), self.rng)

    def draft_cost(self, num_seqs: int, q: int) -> float:
        """Nothing computes: any draft found pays (the lessons expect every one verified)."""
        return 1.0

    # the copies: no bytes to move (the tests' content shadow follows the same copies)
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def load(self, pairs: list[tuple[int, int]]) -> None:
        pass

    def fetch_ahead(self, slots: list[int]) -> None:
        pass

    can_save_blocks = True

    def save_blocks(self, gpu_ids: list[int], cpu_ids: list[int]) -> Any:
        """No K/V bytes: what a later draw depends on is the RNG's state."""
        return self.rng.getstate()

    def load_blocks(self, saved: Any) -> None:
        self.rng.setstate(saved)

    @staticmethod
    def saved_bytes(saved: Any) -> int:
        return 0

    def read_block(self, block_id: int, layer: int, rank: int | None = None) -> tuple[Any, Any]:
        raise ValueError(NO_TENSORS)

    def kv_bytes_per_rank(self) -> list[int]:
        return []

    def module_path(self) -> Any:
        raise ValueError("the attention probe needs a real model in one process")

    def info(self) -> dict[str, Any]:
        return {}  # the engine says "dry" itself; there is no model to describe

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed
