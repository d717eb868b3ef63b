"""The lean decoder (fused layer ops over re-laid weights) computes what the model's modules do."""

from __future__ import annotations

import pytest
import torch

from engine.runtime.cache_engine import CacheEngine
from engine.runtime.lean_decoder import fuse_projections
from engine.runtime.model_runner import ModelRunner
from engine.runtime.models import _load_default_tokenizer
from engine.runtime.protocols import StepItem
from engine.runtime.tiny_models import build_tiny_random


def test_fusing_keeps_the_modules_outputs_and_adds_no_memory():
    model, _ = build_tiny_random(_load_default_tokenizer())
    model.eval()
    ids = torch.tensor([[5, 77, 300, 12, 9]])
    with torch.inference_mode():
        before = model(ids).logits
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    numel = sum(p.numel() for p in model.parameters())
    lean = fuse_projections(model)
    assert lean is not None and len(lean.layers) == 2
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, before)
    assert sum(p.numel() for p in model.parameters()) == numel
    attn = model.model.layers[0].self_attn
    fused = lean.layers[0].qkv_weight
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()  # the module reads the fused rows
    assert attn.v_proj.weight.data_ptr() == fused[-attn.v_proj.weight.shape[0]:].data_ptr()
    assert len({p.untyped_storage().data_ptr() for p in model.parameters()}) < len(storages)
    again = fuse_projections(model)  # idempotent: the second call finds the fused tensors
    assert again.layers[0].qkv_weight.data_ptr() == fused.data_ptr()
    assert again.layers[0].qkv_weight.shape == fused.shape


def test_architectures_not_laid_out_like_llama_keep_the_module_path():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    qwen3 = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=32))
    assert fuse_projections(qwen3) is None  # per-head q/k norms: not in the lean layer


@pytest.fixture(params=["tiny", pytest.param("default", marks=[pytest.mark.model, pytest.mark.slow])])
def loaded(request, tiny_model):
    return tiny_model if request.param == "tiny" else request.getfixturevalue("default_model")


def test_lean_decode_step_equals_the_module_path(loaded):
    bs = 16
    runners = [ModelRunner(loaded, CacheEngine(loaded, 32, bs), use_lean=lean) for lean in (True, False)]
    assert runners[0].lean is not None and runners[1].lean is None
    prompts = [loaded.tokenizer(p)["input_ids"] for p in ("The capital of France is", "def f(x):")]
    logits = []
    for runner in runners:
        tables = [[9, 2], [30, 5]]
        for ids, table in zip(prompts, tables, strict=True):
            runner.execute([StepItem(ids, 0, table)])
        scores = runner.execute_scores([StepItem([42], len(p), t)
                                        for p, t in zip(prompts, tables, strict=True)])
        logits.append(scores.logits.clone())
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(runners[0].cache.kv_cache, runners[1].cache.kv_cache,
                               atol=1e-4, rtol=1e-4)


def test_lean_prefill_equals_the_module_path(loaded):
    """Mixed steps (a prefill with a cached prefix beside a decode) agree on both paths."""
    ids = loaded.tokenizer("Paged attention splits the KV cache into blocks of tokens")["input_ids"]
    results = []
    for lean in (True, False):
        runner = ModelRunner(loaded, CacheEngine(loaded, 32, 4), use_lean=lean)
        a, b = [3, 11, 7, 20, 1], [8, 30, 2, 15, 9]
        runner.execute([StepItem(ids[:6], 0, a)])
        logits = runner.execute([StepItem(ids[6:], 6, a), StepItem(ids[:9], 0, b)])
        results.append((logits, runner.cache.kv_cache.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-4, rtol=1e-4)
