"""The engine on real models: greedy and beam search equal Hugging Face's generate; prefix hits
skip compute; copy-on-write copies real bytes; preemption changes no output.

The models are loaded once per session (conftest.py); each engine here shares their weights.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.describe.narration import narrate
from engine.runtime.protocols import StepItem

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a paged KV cache far away,",
]


def hf_greedy(lm, hf_attention, prompt_ids: list[int], max_new: int) -> list[int]:
    with hf_attention(lm.model, "sdpa"), torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=max_new,
                                eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def hf_beams(lm, hf_attention, prompt_ids: list[int], k: int, max_new: int) -> list[list[int]]:
    with hf_attention(lm.model, "sdpa"), torch.inference_mode():
        out = lm.model.generate(torch.tensor([prompt_ids]), do_sample=False, num_beams=k,
                                num_return_sequences=k, max_new_tokens=max_new, eos_token_id=None,
                                pad_token_id=0)
    return out[:, len(prompt_ids):].tolist()


# SmolLM2 variants are slow on a CPU: the fast subset checks the same equalities on tiny-random
@pytest.fixture(params=["tiny-random", pytest.param("default", marks=pytest.mark.slow)])
def model(request, tiny_model, default_model):
    return tiny_model if request.param == "tiny-random" else default_model


def engine(lm, **kw) -> LLMEngine:
    kw.setdefault("num_gpu_blocks", 128)
    # the slots' content is tracked and checked after every operation (kv_content.py)
    return LLMEngine(EngineConfig(model=lm.name, device="cpu", dtype="float32",
                                  track_kv_content=True, **kw))


@pytest.mark.slow
@pytest.mark.parametrize(("block_size", "prefix"), [(1, True), (4, False), (16, True), (16, False)])
def test_greedy_serving_equals_hf_generate(model, hf_attention, block_size, prefix):
    eng = engine(model, block_size=block_size, enable_prefix_caching=prefix)
    ids = [eng.tokenizer.encode(p) for p in PROMPTS]
    outs = eng.generate(ids, SamplingParams(max_tokens=8, ignore_eos=True))
    for prompt_ids, out in zip(ids, outs, strict=True):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, hf_attention, prompt_ids, 8)
    eng.check_invariants()


def test_primitives_append_is_greedy_decoding(model, hf_attention):
    eng = engine(model, block_size=4)
    prompt = eng.tokenizer.encode(PROMPTS[0])
    s = eng.add_sequence(prompt)
    eng.append(s, n=5)
    seq = eng.snapshot().sequences[s]
    generated = list(seq.token_ids[len(prompt):]) + [seq.pending_token]
    assert generated == hf_greedy(model, hf_attention, prompt, 6)


def test_paged_logits_equal_hf_forward(default_model, hf_attention):
    eng = engine(default_model, block_size=4)
    prompt = eng.tokenizer.encode(PROMPTS[2])
    scores = eng.runtime.execute([StepItem(prompt, 0, list(range(-(-len(prompt) // 4))))])
    with hf_attention(default_model.model, "eager"), torch.inference_mode():
        ref = default_model.model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(scores.logits[0], ref, rtol=1e-4, atol=1e-4)


def test_prefix_hit_computes_only_the_new_tokens_and_changes_no_output(default_model):
    eng = engine(default_model, block_size=4)
    system = eng.tokenizer.encode("You are a helpful assistant who answers briefly and well.")
    a_ids = system + eng.tokenizer.encode(" What is 2+2?")
    b_ids = system + eng.tokenizer.encode(" Name a colour.")
    eng.add_sequence(a_ids)
    before = eng.runtime.runner.num_tokens_computed
    b = eng.add_sequence(b_ids)
    hit = eng.snapshot().sequences[b].num_cached_tokens
    assert hit == (len(system) // 4) * 4 > 0
    assert eng.runtime.runner.num_tokens_computed - before == len(b_ids) - hit
    alone = engine(default_model, block_size=4)
    c = alone.add_sequence(b_ids)
    assert eng.snapshot().sequences[b].pending_token == alone.snapshot().sequences[c].pending_token


def test_copy_on_write_copies_the_parents_bytes_and_leaves_the_parent_alone(default_model):
    eng = engine(default_model, block_size=4)
    ids = eng.tokenizer.encode("Paging shares memory between the sequences of a request")
    s = eng.add_sequence(ids[:10])  # 4 + 4 + 2: the last block is partly full
    snap = eng.snapshot()
    shared = snap.sequences[s].block_table[-1]
    filled = snap.blocks[shared].num_filled
    assert 0 < filled < 4
    parent_before = [t.clone() for t in eng.inspect_block(shared, 0)]
    last_layer_before = [t.clone() for t in eng.inspect_block(shared, 29)]
    child = eng.fork(s)
    eng.append(child, n=1)
    cow = [e for e in eng.last_events if e.kind == "cow"]
    assert len(cow) == 1 and cow[0].block_ids[0] == shared
    copy = cow[0].block_ids[1]
    for layer, before in ((0, parent_before), (29, last_layer_before)):
        k_par, v_par = eng.inspect_block(shared, layer)
        k_new, v_new = eng.inspect_block(copy, layer)
        assert torch.equal(k_par, before[0]) and torch.equal(v_par, before[1])  # untouched
        assert torch.equal(k_new[:filled], before[0][:filled])  # the copied slots: same bytes
        assert torch.equal(v_new[:filled], before[1][:filled])
        assert k_new[filled].abs().sum() > 0  # the child's write went into the copy


@pytest.mark.parametrize("k", [2, 4])
def test_beam_search_equals_hf(model, hf_attention, k):
    eng = engine(model, block_size=4)
    prompt = eng.tokenizer.encode(PROMPTS[1])
    (out,) = eng.generate([prompt], SamplingParams(max_tokens=6, beam_width=k, ignore_eos=True))
    assert [list(c.token_ids) for c in out.outputs] == hf_beams(model, hf_attention, prompt, k, 6)
    scores = [c.cumulative_logprob for c in out.outputs]
    assert scores == sorted(scores, reverse=True)
    eng.check_invariants()
    assert eng.snapshot().metrics.used_blocks == 0


def test_parallel_samples_share_the_prompt_until_they_diverge_and_a_seed_reproduces(tiny_model):
    def run():
        eng = engine(tiny_model, block_size=4)
        prompt = eng.tokenizer.encode("Sampling four ways from one prompt, sharing it")[:10]
        eng.add_request(prompt, SamplingParams(max_tokens=6, n=4, temperature=1.0, seed=1234,
                                               ignore_eos=True))
        eng.step()  # prefill + fork into 4
        snap = eng.snapshot()
        tables = [s.block_table for s in snap.sequences.values()]
        assert len(tables) == 4 and len(set(tables)) == 1
        assert {snap.blocks[b].ref_count for b in tables[0]} == {4}
        eng.step()  # every sample writes its own token: the shared tail is copied 3 times
        snap = eng.snapshot()
        assert snap.metrics.cow_copies == 3
        full = [b for b in tables[0] if snap.blocks[b].num_filled == 4]
        assert all(snap.blocks[b].ref_count == 4 for b in full)
        while eng.scheduler.has_work():
            last = eng.step()
        return [list(c.token_ids) for c in last.finished[0].outputs]

    first = run()
    assert len({tuple(t) for t in first}) > 1  # the samples differ
    assert run() == first


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_changes_no_output(tiny_model, mode):
    prompts = [[100 + i, 200 + i, 300 + i, 400 + i, 500 + i] for i in range(4)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    big = engine(tiny_model, block_size=4, num_gpu_blocks=64)
    expected = [list(o.outputs[0].token_ids) for o in big.generate(prompts, params)]
    small = engine(tiny_model, block_size=4, num_gpu_blocks=10, preemption_mode=mode,
                   num_cpu_blocks=32 if mode == "swap" else 0)
    ids = [small.add_request(p, params) for p in prompts]
    kinds, outs = set(), {}
    while small.scheduler.has_work():
        result = small.step()
        small.check_invariants()
        kinds |= {e.kind for e in result.events}
        outs.update({o.request_id: list(o.outputs[0].token_ids) for o in result.finished})
    assert [outs[i] for i in ids] == expected
    assert "preempt" in kinds
    if mode == "swap":
        assert {"swap_out", "swap_in"} <= kinds


def test_chunked_prefill_changes_no_output_and_greedy_still_equals_hf(model, hf_attention):
    """A budget of 7 tokens a step chunks every prompt here, beside the other requests' decodes."""
    eng = engine(model, block_size=4, max_num_batched_tokens=7)
    ids = [eng.tokenizer.encode(p) for p in PROMPTS]
    outs = eng.generate(ids, SamplingParams(max_tokens=6, ignore_eos=True))
    for prompt_ids, out in zip(ids, outs, strict=True):
        assert list(out.outputs[0].token_ids) == hf_greedy(model, hf_attention, prompt_ids, 6)
    eng.check_invariants()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_chunked_prefill_with_seeds_prefix_hits_and_preemption_changes_no_output(tiny_model, mode):
    shared = list(range(300, 320))  # a 20-token prefix: prefix hits between the requests
    prompts = [shared + [500 + i] * (3 + 5 * i) for i in range(4)]
    params = [SamplingParams(max_tokens=10, ignore_eos=True),
              SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.9, top_p=0.9, seed=7, n=2)]
    whole = engine(tiny_model, block_size=4, num_gpu_blocks=96, enable_chunked_prefill=False)
    chunked = engine(tiny_model, block_size=4, num_gpu_blocks=24, max_num_batched_tokens=9,
                     preemption_mode=mode, num_cpu_blocks=64 if mode == "swap" else 0)
    kinds: set[str] = set()
    for eng in (whole, chunked):
        for i, p in enumerate(prompts):
            eng.add_request(p, params[i % 2])
    outs: list[dict[int, list]] = [{}, {}]
    for eng, got in zip((whole, chunked), outs, strict=True):
        while eng.scheduler.has_work():
            result = eng.step()
            eng.check_invariants()
            if eng is chunked:
                assert result.num_batched_tokens <= 9
                kinds |= {e.kind for e in result.events}
                kinds |= {"chunk"} if any("chunked" in narrate(e) for e in result.events) else set()
            got.update({o.request_id: [list(c.token_ids) for c in o.outputs] for o in result.finished})
    assert outs[1] == outs[0]
    assert {"chunk", "prefix_hit", "preempt"} <= kinds
