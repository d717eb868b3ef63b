"""What a model's config says about how far back its layers attend: the sliding window of
Mistral, Qwen2 and Qwen3 layers (read here, in one place, for every architecture)."""

from __future__ import annotations

from typing import Any


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding-window layers, or None when every layer attends to the
    whole context: Qwen2/Qwen3 name each layer's kind in `layer_types` (or switch the window on
    with `use_sliding_window`); Mistral slides every layer when `sliding_window` is set."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    kinds = getattr(config, "layer_types", None)
    if kinds is not None:
        return int(window) if "sliding_attention" in kinds else None
    return int(window) if getattr(config, "use_sliding_window", True) else None
