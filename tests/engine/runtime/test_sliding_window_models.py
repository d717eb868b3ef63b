"""Sliding-window models in the paged engine: each KV cache group has its own block table, a
sliding group drops the blocks its window has passed, and the text equals Hugging Face's.

Two tiny models with random weights, window 32, contexts well past it: a Mistral whose every
layer slides (one group, "sliding") and a Qwen2 whose layers alternate full and sliding (two
groups). Greedy and beam search equal HF `generate` (an independently loaded copy, SDPA with
HF's own sliding-window mask), with prefix caching on and off, block sizes 4 and 16, forks,
preemption by swap and recompute, and chunked prefill; a sliding table never holds more than
ceil(window / block_size) + 1 blocks between steps.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from engine import EngineConfig, LLMEngine, OutOfBlocks, SamplingParams
from engine.core.kv_groups import max_blocks_held
from engine.runtime.attention_window import kv_cache_groups, layer_windows

WINDOW = 32
SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
             tie_word_embeddings=True, initializer_range=0.2)
PROMPT = list(range(100, 120))  # 20 tokens; 60 more take the context to 80, past the window


def test_the_windows_are_read_from_each_architecture():
    assert layer_windows(MistralConfig(sliding_window=WINDOW, num_hidden_layers=2)) == [WINDOW] * 2
    assert layer_windows(MistralConfig(sliding_window=None, num_hidden_layers=2)) == [None] * 2
    hybrid = Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, num_hidden_layers=4,
                         layer_types=["full_attention", "sliding_attention"] * 2)
    assert layer_windows(hybrid) == [None, WINDOW] * 2
    groups = kv_cache_groups(hybrid)
    assert [(g.name, g.layers, g.window) for g in groups] == [("full", (0, 2), None),
                                                              ("sliding", (1, 3), WINDOW)]
    off = Qwen2Config(use_sliding_window=False, sliding_window=WINDOW, num_hidden_layers=2)
    assert layer_windows(off) == [None, None]
    assert [g.name for g in kv_cache_groups(LlamaConfig(num_hidden_layers=2))] == ["full"]


def _save(config, folder, tokenizer) -> str:
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module", params=["mistral", "qwen2-hybrid"])
def windowed(request, tmp_path_factory, tiny_model) -> str:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "mistral":
        config = MistralConfig(sliding_window=WINDOW, **SHAPE)
    else:
        config = Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                             **SHAPE)
    return _save(config, folder, tiny_model.tokenizer)


@pytest.fixture(scope="module")
def hf_model(windowed):
    return AutoModelForCausalLM.from_pretrained(windowed, dtype=torch.float32,
                                                attn_implementation="sdpa")


def hf_generate(hf, prompt: list[int], max_new: int, beams: int = 1) -> list[list[int]]:
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new,
                          num_beams=beams, num_return_sequences=beams, eos_token_id=None,
                          pad_token_id=0)
    return out[:, len(prompt):].tolist()


def engine(path: str, **kw) -> LLMEngine:
    kw.setdefault("num_gpu_blocks", 96)
    return LLMEngine(EngineConfig(model=path, device="cpu", dtype="float32", track_kv_content=True,
                                  **kw))


def run_checked(eng: LLMEngine) -> dict[int, list[list[int]]]:
    """Step to the end; after every step the invariants hold and no sequence holds more than
    ceil(W / block_size) + 1 blocks in a sliding table."""
    most = max_blocks_held(WINDOW, eng.config.block_size)
    outs: dict[int, list[list[int]]] = {}
    while eng.has_pending_work():
        result = eng.step()
        eng.check_invariants()
        for view in eng.snapshot().sequences.values():
            for name, table in view.block_tables.items():
                if "sliding" in name:
                    assert sum(b is not None for b in table) <= most, (name, table)
        outs.update({o.request_id: [list(c.token_ids) for c in o.outputs] for o in result.finished})
    return outs


def test_past_the_window_these_models_write_other_text_than_without_it(windowed, hf_model):
    """What makes the equalities below worth checking: the same weights attending to the whole
    context (the engine's behaviour before it had groups) part from the windowed text."""
    off = {"sliding_window": None}
    if "qwen2" in windowed:
        off.update(use_sliding_window=False, layer_types=["full_attention"] * 2)
    whole = AutoModelForCausalLM.from_pretrained(windowed, dtype=torch.float32,
                                                 attn_implementation="sdpa", **off)
    assert hf_generate(whole, PROMPT, 60) != hf_generate(hf_model, PROMPT, 60)


def test_a_model_gets_one_table_per_group(windowed):
    eng = engine(windowed, block_size=8)
    names = [g["name"] for g in eng.engine_info()["kv_cache_groups"]]
    assert names == (["sliding"] if "mistral" in windowed else ["full", "sliding"])
    assert eng.max_model_len == 512  # the window no longer caps a sequence


@pytest.mark.parametrize(("block_size", "prefix"), [(4, True), (16, False), (4, False), (16, True)])
def test_greedy_past_the_window_equals_hf(windowed, hf_model, block_size, prefix):
    eng = engine(windowed, block_size=block_size, enable_prefix_caching=prefix)
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=60, ignore_eos=True))
    assert run_checked(eng)[rid] == hf_generate(hf_model, PROMPT, 60)
    assert eng.snapshot().metrics.dropped_blocks > 0


def test_beams_fork_and_free_past_the_window_and_equal_hf(windowed, hf_model):
    eng = engine(windowed, block_size=4)
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=24, beam_width=3, ignore_eos=True))
    assert run_checked(eng)[rid] == hf_generate(hf_model, PROMPT, 24, beams=3)
    assert eng.snapshot().metrics.used_blocks == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_past_the_window_changes_no_output(windowed, hf_model, mode):
    prompts = [list(range(200 + 30 * i, 220 + 30 * i)) for i in range(3)]
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    # three sequences of 60 tokens: 9 blocks each in a sliding table, 15 more in a full one
    blocks = 18 if "mistral" in windowed else 40
    small = engine(windowed, block_size=4, num_gpu_blocks=blocks, preemption_mode=mode,
                   num_cpu_blocks=96 if mode == "swap" else 0)
    ids = [small.add_request(p, params) for p in prompts]
    outs = run_checked(small)
    assert [outs[i][0] for i in ids] == [hf_generate(hf_model, p, 40)[0] for p in prompts]
    assert small.snapshot().metrics.extra["preemptions"] > 0


def test_chunked_prefill_of_a_long_prompt_equals_hf(windowed, hf_model):
    prompt = list(range(300, 390))  # 90 tokens in chunks of at most 16
    eng = engine(windowed, block_size=4, max_num_batched_tokens=16)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True))
    assert run_checked(eng)[rid] == hf_generate(hf_model, prompt, 12)


def test_a_prefix_hit_holds_for_every_group_and_computes_only_the_rest(windowed, hf_model):
    eng = engine(windowed, block_size=4)
    prompt = list(range(400, 470))  # 70 tokens: 17 full blocks could be hit
    first = eng.add_sequence(prompt)
    eng.free(first)
    before = eng.engine_info()["tokens computed by the model"]
    again = eng.add_sequence(prompt)
    view = eng.snapshot().sequences[again]
    computed = eng.engine_info()["tokens computed by the model"] - before
    assert view.num_cached_tokens == 68 and computed == 2
    sliding = view.block_tables["sliding"]
    # the first computed token (position 68) sees keys 37..68: blocks 9.. only
    assert sliding[:9] == (None,) * 9 and None not in sliding[9:]
    if "full" in view.block_tables:
        assert None not in view.block_tables["full"]
    eng.append(again, n=8)
    generated = list(eng.snapshot().sequences[again].token_ids[70:])
    assert generated + [eng.snapshot().sequences[again].pending_token] == \
        hf_generate(hf_model, prompt, 9)[0]
    eng.check_invariants()


def test_a_sliding_sequence_runs_on_in_a_pool_it_would_outgrow(windowed):
    """n decode steps drop blocks on the way, and the all-or-nothing check counts that: an
    all-sliding model appends 200 tokens (55 blocks without dropping) in a 30-block pool; a
    hybrid's full table still grows, and an append past the pool is refused, nothing changed."""
    eng = engine(windowed, block_size=4, num_gpu_blocks=30)
    s = eng.add_sequence(PROMPT)
    if "mistral" in windowed:
        eng.append(s, n=200)
        assert eng.snapshot().metrics.used_blocks <= max_blocks_held(WINDOW, 4)
    else:
        eng.append(s, n=60)  # 80 tokens: 20 blocks in the full table, 8 in the sliding one
        before = eng.snapshot()
        with pytest.raises(OutOfBlocks):
            eng.append(s, n=8)
        assert eng.snapshot() == before
    eng.check_invariants()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_graphs_and_triton_kernels_past_the_window_equal_hf(windowed, hf_model):
    """The GPU path: decode steps replayed as CUDA graphs with every group's table in the static
    buffers, the Triton kernel starting at the window; float32, so the tokens must match."""
    eng = LLMEngine(EngineConfig(model=windowed, device="cuda", dtype="float32", block_size=16,
                                 num_gpu_blocks=64))
    prompts = [PROMPT, list(range(500, 540))]
    outs = eng.generate(prompts, SamplingParams(max_tokens=60, ignore_eos=True))
    assert [list(o.outputs[0].token_ids) for o in outs] == [hf_generate(hf_model, p, 60)[0]
                                                            for p in prompts]
    assert eng.engine_info()["attention kernel"] == "triton"
    eng.check_invariants()
