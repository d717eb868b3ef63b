"""KV cache groups: layers that attend alike share one block table (vLLM v1's hybrid KV cache).

A model whose layers all attend to the whole context has one group, "full", and a sequence has
one block table, as in the paper. A hybrid model (Qwen2 / Qwen3 `layer_types`, the alternating
full / 128-token-window layers of gpt-oss and Gemma 3) or an all-sliding one (Mistral) has a group
per kind of attention: each group gives every sequence a block table of its own, and all tables
draw their blocks from one pool of equal pages (engine/runtime/cache_engine.py: a page holds the
K/V of one group's layers, so a block id means the same bytes whichever group holds it).

A sliding-window layer lets query position p see keys p - W + 1 .. p. Every future query of a
sequence sits at or after its next position (`num_tokens`: the pending token's), so a block whose
last position is below num_tokens - W + 1 can never be read again: its table entry becomes None
(dropped) and the block goes back to the pool. A sequence then holds at most
ceil(W / block_size) + 1 blocks in a sliding group, however long it grows.

Torch-free: the groups come from the runtime (a model's config) or from the dry mode's settings.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroup:
    """One group of layers that share a block table."""

    name: str  # "full", "sliding" ("sliding-W" when a model has several windows)
    layers: tuple[int, ...]  # the model's layer indices in this group
    window: int | None  # sliding window in tokens; None: the whole context

    @property
    def sliding(self) -> bool:
        return self.window is not None


def single_group(num_layers: int = 0) -> tuple[KVCacheGroup, ...]:
    """The one group of a model without sliding windows (and of the dry mode by default)."""
    return (KVCacheGroup("full", tuple(range(num_layers)), None),)


def dry_groups(window: int | None) -> tuple[KVCacheGroup, ...]:
    """The dry mode's groups: one, or with `sliding_window` a hybrid's two (a "full" group and
    a "sliding" one), with no layers behind them."""
    if window is None:
        return single_group()
    return (KVCacheGroup("full", (), None), KVCacheGroup("sliding", (), window))


def groups_of(layer_windows: Seq[int | None]) -> tuple[KVCacheGroup, ...]:
    """The groups of a model from each layer's window (None: full attention). Full attention
    first, so that a sequence's first table (`block_table`) is the one that keeps every block."""
    windows = sorted({w for w in layer_windows if w is not None})
    if not layer_windows:
        return single_group()
    groups = []
    if None in layer_windows:
        groups.append(KVCacheGroup("full", _layers(layer_windows, None), None))
    for w in windows:
        name = "sliding" if len(windows) == 1 else f"sliding-{w}"
        groups.append(KVCacheGroup(name, _layers(layer_windows, w), w))
    return tuple(groups)


def _layers(layer_windows: Seq[int | None], window: int | None) -> tuple[int, ...]:
    return tuple(i for i, w in enumerate(layer_windows) if w == window)


def dead_blocks(num_tokens: int, window: int | None, block_size: int, table_len: int) -> int:
    """How many of a table's first entries no future query can see: blocks wholly left of the
    window of the next position. Never the last block (the next token is written after it)."""
    if window is None:
        return 0
    return max(0, min((num_tokens - window + 1) // block_size, table_len - 1))


def first_needed_block(position: int, window: int | None, block_size: int) -> int:
    """The first logical block a query at `position` reads (0 without a window)."""
    if window is None:
        return 0
    return max(0, position - window + 1) // block_size


def max_blocks_held(window: int, block_size: int) -> int:
    """The most blocks a sequence holds in a sliding group between steps."""
    return -(-window // block_size) + 1
