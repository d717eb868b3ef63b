"""The two models PagedLab builds in code, seeded: "tiny-random" and "tiny-hybrid".

"tiny-random" is a two-layer random Llama (fast tests); "tiny-hybrid" a four-layer random Qwen2
whose layers alternate full and 32-token sliding-window attention (gpt-oss's pattern with a
smaller window, so a lesson sees the window move within a few blocks). Both take the default
model's tokenizer from the caller and have the same weights on every machine.
"""

from __future__ import annotations

from typing import Any

import torch

TINY_RANDOM_SEED = 1234
TINY_HYBRID_WINDOW = 32
#: each built-in model's shape, read before anything is built (a tensor-parallel size is
#: checked against its heads before workers start)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny-random": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=3, num_key_value_heads=1, head_dim=64),
    "tiny-hybrid": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}


def build_tiny_random(tokenizer: Any) -> tuple[Any, str]:
    """The random two-layer Llama and where it came from."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _build_in_code(LlamaConfig, LlamaForCausalLM, tokenizer, "", **SHAPES["tiny-random"])


def build_tiny_hybrid(tokenizer: Any) -> tuple[Any, str]:
    """The random four-layer Qwen2 with full / sliding layers alternating."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _build_in_code(
        Qwen2Config, Qwen2ForCausalLM, tokenizer,
        f", layers full / sliding {TINY_HYBRID_WINDOW} alternating", **SHAPES["tiny-hybrid"],
        use_sliding_window=True, sliding_window=TINY_HYBRID_WINDOW, max_window_layers=0,
        layer_types=["full_attention", "sliding_attention"] * 2)


def _build_in_code(config_cls: Any, model_cls: Any, tokenizer: Any, what: str,
                   **shape: Any) -> tuple[Any, str]:
    config = config_cls(
        vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
        # The default 0.02 makes all logits nearly equal, so greedy decoding would hinge on
        # rounding; a larger scale gives clear winners (and less repetitive text).
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **shape,
    )
    config._attn_implementation = "sdpa"
    # A private RNG state: the weights are the same on every machine and the caller's seed
    # stays untouched. Built on the CPU so a GPU run gets bit-identical weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_RANDOM_SEED)
        model = model_cls(config)
    return model, f"built in code ({config_cls.__name__}{what}, seed {TINY_RANDOM_SEED})"
