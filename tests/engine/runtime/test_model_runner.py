"""ModelRunner + CacheEngine against plain Hugging Face: the paged path must compute the same thing.

The engine facade is not involved: block tables are allocated by hand here, on purpose scattered
over the pool (not 0, 1, 2, ...), so that a bug in the slot mapping cannot hide behind an identity
layout.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine.runtime.cache_engine import CacheEngine, KVShape
from engine.runtime.model_runner import ModelRunner
from engine.runtime.protocols import StepItem

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
TOL = {"atol": 1e-4, "rtol": 1e-4}  # float32 on both sides; only summation order differs


class HandAllocator:
    """Hands out the pool's block ids in a shuffled order (a stand-in for the block pool)."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def grow(self, table: list[int], num_tokens: int, block_size: int) -> list[int]:
        while len(table) * block_size < num_tokens:
            table.append(self.free.pop())
        return table


def make_runner(loaded, block_size: int, num_blocks: int = 64) -> ModelRunner:
    return ModelRunner(loaded, CacheEngine(loaded, num_blocks, block_size))


def hf_last_logits(loaded, ids: list[int], hf_attention) -> torch.Tensor:
    with torch.inference_mode(), hf_attention(loaded.model, "eager"):
        return loaded.model(torch.tensor([ids])).logits[0, -1].float()


def paged_greedy(loaded, ids: list[int], block_size: int, max_new: int) -> list[int]:
    """Prefill, then decode one token at a time through the runner (greedy)."""
    runner = make_runner(loaded, block_size, num_blocks=-(-(len(ids) + max_new) // block_size) + 3)
    alloc = HandAllocator(runner.cache.num_gpu_blocks, seed=block_size)
    table = alloc.grow([], len(ids), block_size)
    logits = runner.execute([StepItem(list(ids), 0, table)])
    out: list[int] = []
    while True:
        token = int(logits[0].argmax())
        out.append(token)
        if len(out) == max_new or token in loaded.eos_token_ids:
            return out
        num_computed = len(ids) + len(out) - 1
        table = alloc.grow(table, num_computed + 1, block_size)
        logits = runner.execute([StepItem([token], num_computed, table)])


_GENERATED: dict[tuple[str, str, int], list[int]] = {}


def hf_greedy(loaded, ids: list[int], max_new: int, hf_attention) -> list[int]:
    key = (loaded.name, str(ids), max_new)
    if key not in _GENERATED:
        with torch.inference_mode(), hf_attention(loaded.model, "sdpa"):
            out = loaded.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new, do_sample=False,
                pad_token_id=loaded.tokenizer.pad_token_id or loaded.eos_token_ids[0],
            )
        _GENERATED[key] = out[0, len(ids):].tolist()
    return _GENERATED[key]


@pytest.fixture(params=["tiny", pytest.param("default", marks=[pytest.mark.model, pytest.mark.slow])])
def loaded(request, tiny_model):
    if request.param == "tiny":
        return tiny_model
    return request.getfixturevalue("default_model")


def test_prefill_logits_match_hf(loaded, hf_attention):
    ids = loaded.tokenizer(PROMPTS[0] + " a city that")["input_ids"]
    runner = make_runner(loaded, block_size=4)
    table = HandAllocator(64).grow([], len(ids), 4)
    paged = runner.execute([StepItem(ids, 0, table)])
    torch.testing.assert_close(paged[0], hf_last_logits(loaded, ids, hf_attention), **TOL)
    assert paged.dtype == torch.float32 and paged.shape == (1, loaded.vocab_size)


def test_two_chunk_prefill_matches_and_skips_the_cached_prefix(loaded, hf_attention):
    ids = loaded.tokenizer(PROMPTS[1] + "return n if n < 2 else")["input_ids"]
    split = 5  # not a multiple of the block size: the second chunk starts mid-block
    runner = make_runner(loaded, block_size=4)
    alloc = HandAllocator(64, seed=1)
    table = alloc.grow([], split, 4)
    runner.execute([StepItem(ids[:split], 0, table)])
    assert runner.num_tokens_computed == split
    table = alloc.grow(table, len(ids), 4)
    logits = runner.execute([StepItem(ids[split:], split, table)])
    assert runner.num_tokens_computed == len(ids)  # the prefix was read, not recomputed
    torch.testing.assert_close(logits[0], hf_last_logits(loaded, ids, hf_attention), **TOL)


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_decode_matches_hf_generate(loaded, prompt, block_size, hf_attention):
    ids = loaded.tokenizer(prompt)["input_ids"]
    max_new = 8 if loaded.name == "default" else 12
    expected = hf_greedy(loaded, ids, max_new, hf_attention)
    assert paged_greedy(loaded, ids, block_size, max_new) == expected


def test_mixed_batch_equals_separate_runs(tiny_model):
    bs = 4
    tok = tiny_model.tokenizer
    a = tok("A fresh prompt that is prefilled")["input_ids"]
    b = tok("One sequence in decode")["input_ids"]
    c = tok("Another one, longer, also decoding now")["input_ids"]
    b_next, c_next = 42, 4242

    def tables(alloc: HandAllocator) -> dict[str, list[int]]:
        return {"a": alloc.grow([], len(a), bs), "b": alloc.grow([], len(b) + 1, bs),
                "c": alloc.grow([], len(c) + 1, bs)}

    # Separately: each sequence alone in its own forward passes.
    alone = make_runner(tiny_model, bs)
    t = tables(HandAllocator(64, seed=3))
    want_a = alone.execute([StepItem(a, 0, t["a"])])[0]
    alone.execute([StepItem(b, 0, t["b"])])
    want_b = alone.execute([StepItem([b_next], len(b), t["b"])])[0]
    alone.execute([StepItem(c, 0, t["c"])])
    want_c = alone.execute([StepItem([c_next], len(c), t["c"])])[0]

    # Together: b and c were prefilled earlier; now one step holds a's prefill and two decodes.
    mixed = make_runner(tiny_model, bs)
    t = tables(HandAllocator(64, seed=4))
    mixed.execute([StepItem(b, 0, t["b"]), StepItem(c, 0, t["c"])])
    before = mixed.num_tokens_computed
    got = mixed.execute([
        StepItem(a, 0, t["a"]),
        StepItem([b_next], len(b), t["b"]),
        StepItem([c_next], len(c), t["c"]),
    ])
    assert mixed.num_tokens_computed - before == len(a) + 2
    torch.testing.assert_close(got, torch.stack([want_a, want_b, want_c]), **TOL)


def test_new_tokens_land_in_their_slots(tiny_model):
    """The K written for token p sits in block table[p // bs] at offset p % bs, every layer."""
    bs = 4
    ids = tiny_model.tokenizer("Slots and blocks")["input_ids"]
    runner = make_runner(tiny_model, bs, num_blocks=16)
    table = [9, 2, 14][: -(-len(ids) // bs)]
    runner.execute([StepItem(ids, 0, table)])
    for layer in range(tiny_model.num_layers):
        for logical, block in enumerate(table):
            k, v = runner.cache.read_block(layer, block)
            filled = min(bs, len(ids) - logical * bs)
            assert k[:filled].abs().sum() > 0 and v[:filled].abs().sum() > 0
            assert k[filled:].abs().sum() == 0  # never-written slots stay zero
        untouched = [b for b in range(16) if b not in table]
        assert runner.cache.kv_cache[layer, :, untouched].abs().sum() == 0


def test_bad_block_table_is_refused_before_any_write(tiny_model):
    runner = make_runner(tiny_model, 4, num_blocks=8)
    with pytest.raises(ValueError, match="needs 2 blocks"):
        runner.execute([StepItem([1, 2, 3, 4, 5], 0, [3])])
    with pytest.raises(ValueError, match="outside the pool"):
        runner.execute([StepItem([1, 2], 0, [8])])
    with pytest.raises(ValueError, match="no new tokens"):
        runner.execute([StepItem([], 0, [1])])
    assert runner.cache.kv_cache.abs().sum() == 0 and runner.num_tokens_computed == 0


def test_plain_hf_calls_still_work_on_the_shared_model(tiny_model, hf_attention):
    """After a runner switched the model to "pagedlab", an ordinary padded batch still gets the
    right answer (the plug-in is SDPA when there is no paged metadata)."""
    make_runner(tiny_model, 4)
    assert tiny_model.model.config._attn_implementation == "pagedlab"
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.inference_mode():
        ours = tiny_model.model(ids, attention_mask=mask).logits[:, -1]
        with hf_attention(tiny_model.model, "eager"):
            ref = tiny_model.model(ids, attention_mask=mask).logits[:, -1]
    torch.testing.assert_close(ours, ref, **TOL)


# ---- CacheEngine: bytes -------------------------------------------------------------------------

SHAPE = KVShape(num_layers=3, num_kv_heads=2, head_dim=8)


def random_cache(num_blocks: int = 8, num_cpu_blocks: int = 4) -> CacheEngine:
    cache = CacheEngine(SHAPE, num_blocks, block_size=4, num_cpu_blocks=num_cpu_blocks,
                        device="cpu", dtype=torch.float32)
    cache.kv_cache.copy_(torch.randn(cache.kv_cache.shape, generator=torch.Generator().manual_seed(0)))
    return cache


def test_pool_layout_and_sizes():
    cache = random_cache()
    assert cache.kv_cache.shape == (3, 2, 8, 4, 2, 8)
    assert cache.cpu_cache.shape == (3, 2, 4, 4, 2, 8)
    assert cache.kv_bytes_per_token == 2 * 3 * 2 * 8 * 4
    assert cache.bytes_per_block == cache.kv_bytes_per_token * 4
    assert cache.k_cache(1).is_contiguous() and cache.v_cache(1).is_contiguous()


def test_copy_blocks_copies_every_layer():
    cache = random_cache()
    before = cache.kv_cache.clone()
    cache.copy_blocks([(1, 6), (2, 5)])
    after = cache.kv_cache
    assert torch.equal(after[:, :, 6], before[:, :, 1]) and torch.equal(after[:, :, 5], before[:, :, 2])
    others = [0, 1, 2, 3, 4, 7]
    assert torch.equal(after[:, :, others], before[:, :, others])


def test_swap_out_and_in_round_trip():
    cache = random_cache()
    original = cache.kv_cache.clone()
    cache.swap_out([(1, 0), (6, 3)])
    assert torch.equal(cache.cpu_cache[:, :, 0], original[:, :, 1])
    cache.kv_cache[:, :, [1, 6]] = 0  # the blocks are reused while the sequence is away
    cache.swap_in([(0, 2), (3, 7)])  # and come back into other blocks
    assert torch.equal(cache.kv_cache[:, :, 2], original[:, :, 1])
    assert torch.equal(cache.kv_cache[:, :, 7], original[:, :, 6])


def test_out_of_range_pairs_change_nothing():
    cache = random_cache()
    before, cpu_before = cache.kv_cache.clone(), cache.cpu_cache.clone()
    with pytest.raises(ValueError, match="out of range"):
        cache.copy_blocks([(1, 2), (3, 8)])
    with pytest.raises(ValueError, match="out of range"):
        cache.swap_out([(0, 4)])
    with pytest.raises(ValueError, match="out of range"):
        cache.swap_in([(4, 0)])
    assert torch.equal(cache.kv_cache, before) and torch.equal(cache.cpu_cache, cpu_before)


def test_out_of_range_tier_pairs_change_nothing():
    cache = CacheEngine(SHAPE, 8, block_size=4, num_cpu_blocks=0, device="cpu",
                        dtype=torch.float32, num_offload_blocks=4)
    cache.kv_cache.normal_()
    cache.offload([(1, 0), (2, 3)])
    before, slots_before = cache.kv_cache.clone(), cache.tier.slots.clone()
    for bad in (lambda: cache.offload([(3, 1), (8, 2)]), lambda: cache.offload([(3, 4)]),
                lambda: cache.load([(0, 5), (4, 6)]), lambda: cache.load([(3, 8)]),
                lambda: cache.fetch_ahead([2, 4])):
        with pytest.raises(ValueError, match=r"block pair \(\d+, \d+\) out of range"):
            bad()
    assert torch.equal(cache.kv_cache, before) and torch.equal(cache.tier.slots, slots_before)
    cache.load([(0, 5), (3, 6)])  # good pairs still work: the bytes come back
    assert torch.equal(cache.kv_cache[:, :, 5], cache.kv_cache[:, :, 1])
    assert torch.equal(cache.kv_cache[:, :, 6], cache.kv_cache[:, :, 2])


def test_read_block_gives_cpu_float_k_and_v():
    cache = random_cache()
    k, v = cache.read_block(2, 5)
    assert k.device.type == "cpu" and k.dtype == torch.float32 and k.shape == (4, 2, 8)
    assert torch.equal(k, cache.kv_cache[2, 0, 5]) and torch.equal(v, cache.kv_cache[2, 1, 5])
    with pytest.raises(ValueError):
        cache.read_block(3, 0)


def test_pool_sized_from_a_cpu_byte_budget(tiny_model):
    cache = CacheEngine(tiny_model, None, block_size=16, cpu_pool_bytes=64 * 1024**2)
    assert cache.num_gpu_blocks == 64 * 1024**2 // cache.bytes_per_block
    assert "CPU budget" in cache.sizing_note and str(cache.num_gpu_blocks) in cache.sizing_note
    assert cache.describe()["sizing"] == cache.sizing_note
