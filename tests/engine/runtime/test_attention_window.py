"""Sliding-window models: the engine attends to the whole context, so it stops where the context
would outgrow the window instead of giving text that silently differs from the model's.

A tiny Mistral (every layer slides) and a tiny Qwen2 (full and sliding layers) with random
weights, window 32: within the window the engine's greedy tokens equal Hugging Face's generate;
a request that would pass it is refused with a message, and the engine is unchanged.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.runtime.attention_window import sliding_window

WINDOW = 32
SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
             tie_word_embeddings=True, initializer_range=0.2)


def test_the_window_is_read_from_each_architecture():
    assert sliding_window(MistralConfig(sliding_window=WINDOW)) == WINDOW
    assert sliding_window(MistralConfig(sliding_window=None)) is None
    hybrid = Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, num_hidden_layers=2,
                         max_window_layers=1)
    assert "sliding_attention" in hybrid.layer_types and sliding_window(hybrid) == WINDOW
    assert sliding_window(Qwen2Config(use_sliding_window=False, sliding_window=WINDOW)) is None
    assert sliding_window(LlamaConfig()) is None


def _save(config, folder, default_model) -> str:
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    default_model.tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module", params=["mistral", "qwen2-hybrid"])
def windowed(request, tmp_path_factory, default_model) -> str:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "mistral":
        config = MistralConfig(sliding_window=WINDOW, **SHAPE)
    else:
        config = Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                             **SHAPE)
    return _save(config, folder, default_model)


def test_within_the_window_greedy_equals_hf_and_past_it_is_refused(windowed):
    eng = LLMEngine(EngineConfig(model=windowed, device="cpu", dtype="float32", block_size=8,
                                 num_gpu_blocks=16))
    assert eng.max_model_len == WINDOW  # the pool holds 128 tokens; the window is what limits
    prompt = list(range(100, 120))
    out = eng.generate([prompt], SamplingParams(max_tokens=WINDOW - len(prompt), ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(windowed, dtype=torch.float32)
    with torch.inference_mode():
        want = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=WINDOW - 20,
                           eos_token_id=None, pad_token_id=0)[0, 20:].tolist()
    assert list(out[0].outputs[0].token_ids) == want
    with pytest.raises(ValueError, match=f"{WINDOW} tokens"):
        eng.generate([prompt], SamplingParams(max_tokens=WINDOW, ignore_eos=True))
    eng.check_invariants()
    assert not eng.has_pending_work()
