"""The static prefill path (what the prefill CUDA graphs capture) computes what the general path
computes: on the CPU it runs eagerly from the same padded buffers (a bucket of tokens, padding
sequences, the attention's tile map), so the layout and the padding are checked here, bytes of
the KV pool included; the CUDA test replays the graphs against the eager path."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config

from engine.runtime.cache_engine import CacheEngine
from engine.runtime.model_runner import ModelRunner
from engine.runtime.models import load_model
from engine.runtime.prefill_graphs import PrefillGraphs
from engine.runtime.protocols import StepItem
from tests.engine.runtime.test_sliding_window_models import SHAPE, WINDOW, _save

BS = 4


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory, tiny_model) -> str:
    """A two-layer Qwen2, layer 0 full and layer 1 a 32-token window: two KV cache groups."""
    config = Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW,
                         layer_types=["full_attention", "sliding_attention"])
    return _save(config, tmp_path_factory.mktemp("hybrid"), tiny_model.tokenizer)


@pytest.fixture(scope="module")
def hybrid_model(hybrid_path):
    return load_model(hybrid_path, device="cpu", dtype="float32")


def _runners(model, prefill_tokens: int, device: str = "cpu") -> tuple[ModelRunner, ModelRunner]:
    dev = torch.device(device)
    general = ModelRunner(model, CacheEngine(model, 96, BS, device=dev, dtype=model.dtype),
                          max_batch=8, prefill_tokens=None)
    static = ModelRunner(model, CacheEngine(model, 96, BS, device=dev, dtype=model.dtype),
                         max_batch=8, prefill_tokens=prefill_tokens)
    return general, static


def _item(tokens: list[int], done: int, first: int, groups: int) -> StepItem:
    """Blocks first, first + 1, ... in group 0, and the next ones in each further group."""
    k = -(-(done + len(tokens)) // BS)
    tables = [list(range(first + g * k, first + (g + 1) * k)) for g in range(groups)]
    return StepItem(tokens, done, tables[0], 1, tuple(tables[1:]))


def _mixed_step(runner: ModelRunner, groups: int) -> list[StepItem]:
    """Two sequences' earlier tokens computed, then the step to compare: a fresh prompt of 50
    tokens, a chunk of 20 after 40 cached ones, a decode at position 45."""
    ids = [(7 * i) % 400 + 5 for i in range(60)]
    runner.execute([_item(ids[:40], 0, 0, groups), _item(ids[10:55], 0, 40, groups)])
    return [_item(ids[5:55], 0, 60, groups), _item(ids[40:60], 40, 0, groups),
            _item([ids[3]], 45, 40, groups)]


@pytest.mark.parametrize("which", ["llama", "hybrid"])
def test_a_mixed_step_from_the_prefill_buffers_equals_the_general_path(tiny_model, hybrid_model,
                                                                       which):
    model = tiny_model if which == "llama" else hybrid_model
    groups = 1 if which == "llama" else 2
    general, static = _runners(model, prefill_tokens=128)
    assert static.prefill is not None and static.prefill.sizes == (128,)
    want = general.execute(_mixed_step(general, groups))
    got = static.execute_scores(_mixed_step(static, groups)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the padding tokens wrote nothing: the pools hold the same bytes
    assert torch.equal(static.cache.kv_cache, general.cache.kv_cache)
    assert static.num_tokens_computed == general.num_tokens_computed
    assert static.prefill.num_steps == 1


def test_a_step_past_the_buffers_goes_the_general_way(tiny_model):
    general, static = _runners(tiny_model, prefill_tokens=64)  # the step has 71 tokens
    want = general.execute(_mixed_step(general, 1))
    got = static.execute_scores(_mixed_step(static, 1)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert static.prefill.num_steps == 0
    assert static.prefill.bucket(71, 3, 16) is None and static.prefill.bucket(64, 3, 16) == 64


def test_fed_tokens_land_in_their_sequences_last_rows(tiny_model):
    """Async scheduling: a decode's token is still on the device when its step is prepared."""
    general, static = _runners(tiny_model, prefill_tokens=128)
    want = general.execute(_mixed_step(general, 1))
    batch = _mixed_step(static, 1)
    token = batch[2].token_ids[0]
    batch[2] = StepItem([-1], 45, batch[2].block_table)  # the in-flight placeholder
    picks = torch.tensor([11, token, 12])
    got = static.execute_scores(batch, feed=([(2, 1)], picks)).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert static.prefill.num_steps == 1


def test_buckets_step_by_256_tokens_up_to_the_budget_and_at_most_32():
    graphs = PrefillGraphs(lambda *a: None, torch.device("cpu"), 1000, 4, 8, 1, lambda t: 16)
    assert graphs.sizes == (256, 512, 768, 1000)
    assert graphs.bucket(1, 1, 8) == 256 and graphs.bucket(769, 4, 8) == 1000
    assert graphs.bucket(1001, 1, 8) is None
    assert graphs.bucket(100, 5, 8) is None and graphs.bucket(100, 4, 9) is None
    big = PrefillGraphs(lambda *a: None, torch.device("cpu"), 16384, 4, 8, 1, lambda t: 16)
    assert len(big.sizes) == 32 and big.sizes[:2] == (512, 1024) and big.sizes[-1] == 16384


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("which", ["llama", "hybrid"])
def test_on_a_gpu_the_replayed_graph_equals_the_eager_path(hybrid_path, which):
    model = load_model("tiny-random" if which == "llama" else hybrid_path, device="cuda",
                       dtype="float32")
    groups = 1 if which == "llama" else 2
    general, static = _runners(model, prefill_tokens=512, device="cuda")
    want = general.execute(_mixed_step(general, groups))
    assert static.prefill.bucket(71, 3, 16) is None  # not captured: the eager path
    static.prefill.capture()  # what the runner's warm-up does
    assert sorted(static.prefill.graphs) == [256, 512]
    for _ in range(2):
        got = static.execute_scores(_mixed_step(static, groups)).logits
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert static.prefill.num_replays == 2
    torch.testing.assert_close(static.cache.kv_cache, general.cache.kv_cache, atol=1e-5, rtol=0)
