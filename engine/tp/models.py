"""Random-weight Llamas with an even number of KV heads, saved as local model folders.

The default model has 3 KV heads (tensor-parallel sizes 1 and 3 only), and "tiny-random" has 1.
Tests and bench/tensor_parallel.py need models that split in two: this writes a random Llama of
a given shape, with the default model's tokenizer, into a folder that `EngineConfig(model=...)`
loads like any local model. Same shape and seed give the same weights on every machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# A two-layer model for CPU tests (2 KV heads: sizes 1 and 2), and the bench's model of
# TinyLlama-1.1B's shape (4 KV heads: sizes 1, 2, 4; about 1.1e9 parameters with this vocabulary).
TINY_KV2 = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
LLAMA_1B = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
            "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 64}
# Llama-3-8B's layers (8 KV heads: sizes 1, 2, 4, 8), with this vocabulary and an untied LM head
LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}


def save_random_llama(folder: str | Path, shape: dict[str, int], seed: int = 0,
                      dtype: torch.dtype = torch.float32, init: float | None = None,
                      device: str = "cpu", tie: bool = True) -> Path:
    """Write a random Llama of `shape` into `folder` (kept if it is already there). `init`: the
    initialiser's spread (default: 0.2 for small models, whose greedy choices are then clear;
    SmolLM2's own 0.02 makes one whose greedy output soon repeats a token). `device="cuda"`
    draws the weights there, in `dtype` (a benchmark's 8B model in seconds, not minutes; not
    the CPU's numbers). `tie`: the LM head shares the embedding (Llama-3-8B's does not)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from engine.runtime.models import _load_default_tokenizer

    folder = Path(folder)
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    tokenizer = _load_default_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
        initializer_range=init or (0.2 if shape["hidden_size"] < 1024 else 0.02),  # clear winners
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **shape)
    config.tie_word_embeddings = tie
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if device == "cpu":
            model: Any = LlamaForCausalLM(config).to(dtype)
        else:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype)
            model = model.to("cpu")  # saved from host memory, as the CPU-drawn ones are
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder
