"""Issue 36 on the real model: the classroom's workload (students sharing one system prompt, a
20-block pool that must swap into 6 CPU blocks, requests arriving a few before each step), every
output compared with the same request run alone, in float32. The engine also tracks its slots'
content here (EngineConfig.track_kv_content) and checks after every step that each sequence's
tables read back its own tokens.

Six students in an arrival order where a swap-in and a swap-out meet in one step: before the
copies ran in the bookkeeping's order, the swap-out wrote the CPU blocks that swap-in was yet to
read, and a request answered from another's K/V ("What is 2 plus 2?" in the 30-student run this
test once made). The second test puts that old order back and sees it caught, so the workload
still reaches the case at this size."""

from __future__ import annotations

import random

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams, step_run
from engine.core.invariants import InvariantError
from tests.engine.core.test_copy_order import old_fixed_order

pytestmark = [pytest.mark.model, pytest.mark.slow]  # ~15 s: 6 requests under load, then alone
SYSTEM = "You are a friendly tutor. Answer in one short sentence."
# every output its full length, so the steps (and where a swap-in meets a swap-out) do not hang
# on where a CPU's float32 rounding lets the model stop
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
STUDENTS = 6
ORDER_SEED = 7  # an arrival order whose swap-in and swap-out meet in one step (the second test)


def chat(eng: LLMEngine, i: int) -> list[int]:
    ids = eng.tokenizer.hf.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {i} plus {i}?"}],
        add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def classroom() -> tuple[LLMEngine, list[list[int]], dict[int, list[int]], list[set[str]]]:
    """The workload run to the end: the engine, the prompts, each student's output and each
    step's kinds of event."""
    eng = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32", block_size=8,
                                 num_gpu_blocks=20, num_cpu_blocks=6, preemption_mode="swap",
                                 track_kv_content=True))
    prompts = [chat(eng, i) for i in range(STUDENTS)]
    r = random.Random(ORDER_SEED)
    order = list(range(STUDENTS))
    r.shuffle(order)
    rid_to_i: dict[int, int] = {}
    outs: dict[int, list[int]] = {}
    steps: list[set[str]] = []
    while order or eng.has_pending_work():
        for _ in range(r.randint(0, 8)):
            if order:
                i = order.pop()
                rid_to_i[eng.add_request(prompts[i], PARAMS)] = i
        result = eng.step()
        eng.check_invariants()
        steps.append({e.kind for e in result.events})
        outs.update({rid_to_i[o.request_id]: list(o.outputs[0].token_ids) for o in result.finished})
    return eng, prompts, outs, steps


def test_swapped_requests_sharing_a_prefix_answer_as_they_do_alone(default_model):
    eng, prompts, outs, steps = classroom()
    assert {"swap_out", "swap_in", "prefix_hit"} <= set().union(*steps)
    assert any({"swap_out", "swap_in"} <= kinds for kinds in steps)
    alone = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32", block_size=8,
                                   num_gpu_blocks=64))
    wrong = {i: (eng.decode(outs[i]), eng.decode(expected))
             for i in range(STUDENTS)
             if outs[i] != (expected := list(alone.generate(prompts[i], PARAMS)[0].outputs[0].token_ids))}
    assert wrong == {}


def test_the_copy_order_before_the_fix_goes_wrong_in_this_workload(default_model, monkeypatch):
    # every kind of copy in one batch, swap-outs first: the content check sees a slot read back
    # another token's K/V (so the test above would fail on the engine before the fix)
    monkeypatch.setattr(step_run, "copy_waves", old_fixed_order)
    with pytest.raises(InvariantError, match="should hold the K/V of its token"):
        classroom()
