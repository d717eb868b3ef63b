"""When a step drafts (engine/core/draft_policy.py): a sequence whose lookups miss backs off,
a step drafts only where its drafts are expected to pay for their verification, and under async
scheduling a sequence whose text loops drafts every step; text with nothing to draft costs
almost no lookups and keeps its steps overlapped."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.draft_policy import MAX_WAIT, DraftPolicy
from engine.core.sequence import Sequence


def policy(cost: float = 1.0) -> DraftPolicy:
    return DraftPolicy(2, 4, 4, lambda n, q: cost)


def test_a_sequence_whose_lookups_miss_waits_twice_as_long_each_time() -> None:
    p, seq = policy(), Sequence(0, token_ids=[1, 2, 3, 4, 5, 6])
    looked = [step for step in range(200) if p.state(seq).next_lookup <= step
              and p.propose(seq, 4, step) == []]
    gaps = [b - a for a, b in zip(looked, looked[1:], strict=False)]
    assert gaps[:7] == [1, 2, 3, 5, 9, 17, 33] and max(gaps) == MAX_WAIT + 1
    seq.token_ids += [5, 6]  # the tail repeats now: the next lookup finds it and resets the wait
    step = p.state(seq).next_lookup
    assert p.propose(seq, 4, step) == [5, 6, 5, 6] and p.state(seq).wait == 0


def test_a_step_drafts_only_where_the_expected_kept_tokens_pay_for_the_verification() -> None:
    seqs = [Sequence(i) for i in range(8)]
    one = [(seqs[0], [1, 2, 3, 4])]  # expected to keep 0.5 x 4 = 2 tokens
    assert policy(1.0).pays(one, 8)  # a verification that costs nothing more: any draft pays
    assert policy(1.2).pays(one, 1)  # one sequence: 3 tokens for 1.2 steps
    assert not policy(1.3).pays(one, 8)  # 8 + 2 tokens for the price of 10.4
    assert policy(1.3).pays([(s, [1, 2, 3, 4]) for s in seqs], 8)  # 24 for 10.4
    assert not policy(1.0).pays([], 8)


def test_a_draft_with_nothing_kept_lowers_the_expected_share_and_backs_off() -> None:
    p, seq = policy(), Sequence(0)
    for _ in range(6):
        p.verified(seq, 4, 0, step=10)
    assert p.state(seq).rate < 0.1 and p.state(seq).next_lookup > 11


def test_a_sequence_in_flight_asks_for_a_lookup_only_where_its_known_tail_repeats() -> None:
    p = policy()
    prose = Sequence(0, token_ids=[1, 2, 3, 4, 5, 6, -1])  # its last token still on the device
    assert not any(p.wants_lookup([prose], step) for step in range(40))
    assert p.state(prose).wait == MAX_WAIT  # and it looked up less and less often
    loop = Sequence(1, token_ids=[7, 8, 9, 7, 8, 9, 7, 8, -1])
    assert p.wants_lookup([loop], 0)


def test_in_the_dry_mode_a_draft_that_does_not_pay_is_not_made() -> None:
    def drafts(cost: float) -> int:
        # one matching token drafts: the dry mode's random tokens rarely repeat two
        eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=64,
                                     speculative_method="ngram", num_speculative_tokens=4,
                                     prompt_lookup_min=1))
        eng.scheduler.drafting.cost = lambda n, q: cost
        eng.generate(["the quick brown fox " * 3] * 4, SamplingParams(max_tokens=16))
        return eng.snapshot().metrics.draft_tokens

    assert drafts(1.0) > 0
    assert drafts(50.0) == 0


SPEC = {"speculative_method": "ngram", "num_speculative_tokens": 4}
LIST = ("Repeat the list exactly, then add one more colour.\nList: red, green, blue, yellow, "
        "purple, orange, pink, brown.\nRepeated list:")


@pytest.mark.model
def test_under_async_scheduling_a_sequence_that_loops_drafts_every_step(default_model) -> None:
    eng = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32",
                                 async_scheduling=True, track_kv_content=True, **SPEC))
    eng.add_request(LIST, SamplingParams(max_tokens=40))
    drafted, kept, out = [], [], None
    while eng.has_pending_work():
        result = eng.step()
        drafted.append(any(e.kind == "draft" for e in result.events))
        kept.append(any(e.form == "draft_kept" for e in result.events))
        out = result.finished[0].outputs[0] if result.finished else out
    first = kept.index(True)  # the loop found: a draft every step from there
    assert all(drafted[first:first + 6])
    plain = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32"))
    assert out.token_ids == plain.generate(LIST, SamplingParams(max_tokens=40))[0].outputs[0].token_ids
    assert len(drafted) <= 16  # 40 tokens in at most 16 steps: 2.5 tokens a step or more


@pytest.mark.model
def test_text_with_nothing_to_draft_keeps_its_steps_overlapped(default_model) -> None:
    eng = LLMEngine(EngineConfig(model="default", device="cpu", dtype="float32",
                                 async_scheduling=True, **SPEC))
    eng.add_request("The history of the bicycle begins in",
                    SamplingParams(max_tokens=40, temperature=1.0, seed=3))
    overlapped = steps = 0
    while eng.has_pending_work():
        eng.step()
        steps += 1
        overlapped += eng._flight.launched is not None  # left on the device: the next overlaps
    assert overlapped >= 0.8 * steps
