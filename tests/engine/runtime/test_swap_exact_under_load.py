"""Issue 36 on the real model: the classroom's workload (30 students, one shared system prompt,
a 20-block pool that must swap into 6 CPU blocks, requests arriving a few before each step), every
output compared with the same request run alone, in float32. Before the copies ran in the
bookkeeping's order, this arrival order answered "What is 2 plus 2?" with another request's K/V.
The engine also tracks its slots' content here (EngineConfig.track_kv_content) and checks after
every step that each sequence's tables read back its own tokens."""

from __future__ import annotations

import random

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = [pytest.mark.model, pytest.mark.slow]  # ~30 s: 30 requests twice on the CPU
SYSTEM = "You are a friendly tutor. Answer in one short sentence."
PARAMS = SamplingParams(max_tokens=8)


def chat(eng: LLMEngine, i: int) -> list[int]:
    ids = eng.tokenizer.hf.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {i} plus {i}?"}],
        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_swapped_requests_sharing_a_prefix_answer_as_they_do_alone(default_model):
    cfg = EngineConfig(model="default", device="cpu", dtype="float32", block_size=8,
                       num_gpu_blocks=20, num_cpu_blocks=6, preemption_mode="swap",
                       track_kv_content=True)
    eng = LLMEngine(cfg)
    prompts = [chat(eng, i) for i in range(30)]
    r = random.Random(0)  # an arrival order that went wrong before the fix
    order = list(range(30))
    r.shuffle(order)
    rid_to_i: dict[int, int] = {}
    outs: dict[int, list[int]] = {}
    kinds: set[str] = set()
    while order or eng.has_pending_work():
        for _ in range(r.randint(0, 8)):
            if order:
                i = order.pop()
                rid_to_i[eng.add_request(prompts[i], PARAMS)] = i
        result = eng.step()
        eng.check_invariants()
        kinds |= {e.kind for e in result.events}
        outs.update({rid_to_i[o.request_id]: list(o.outputs[0].token_ids) for o in result.finished})
    assert {"swap_out", "swap_in", "prefix_hit"} <= kinds
    alone = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32", block_size=8,
                                   num_gpu_blocks=64))
    wrong = {i: (eng.decode(outs[i]), eng.decode(expected))
             for i in range(30)
             if outs[i] != (expected := list(alone.generate(prompts[i], PARAMS)[0].outputs[0].token_ids))}
    assert wrong == {}
