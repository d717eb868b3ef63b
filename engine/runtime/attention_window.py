"""What a model's config says about how far back each layer attends: the sliding windows of
Mistral, Qwen2 and Qwen3 layers (read here, in one place, for every architecture), and the KV
cache groups that follow from them (engine/core/kv_groups.py)."""

from __future__ import annotations

from typing import Any

from engine.core.kv_groups import KVCacheGroup, groups_of


def layer_windows(config: Any) -> list[int | None]:
    """Each layer's sliding window (None: it attends to the whole context). Mistral slides every
    layer when `sliding_window` is set (its modules ignore `layer_types`); Qwen2 / Qwen3 name each
    layer's kind in `layer_types`, with the window switched on by `use_sliding_window` (their
    configs set `sliding_window` to None otherwise)."""
    n = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    if not window:
        return [None] * n
    kinds = getattr(config, "layer_types", None)
    if getattr(config, "model_type", None) == "mistral" or kinds is None:
        return [int(window) if getattr(config, "use_sliding_window", True) else None] * n
    return [int(window) if kind == "sliding_attention" else None for kind in kinds]


def kv_cache_groups(config: Any) -> tuple[KVCacheGroup, ...]:
    """The model's KV cache groups: "full" alone, or "full" and "sliding", or "sliding" alone."""
    return groups_of(layer_windows(config))


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding-window layers, or None when every layer attends to the
    whole context."""
    return next((w for w in layer_windows(config) if w is not None), None)
