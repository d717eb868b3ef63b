"""When a step drafts (engine/core/draft_policy.py): a sequence whose lookups miss backs off,
a step drafts only where its drafts are expected to pay for their verification, and under async
scheduling a sequence whose text loops drafts every step; text with nothing to draft costs
almost no lookups and keeps its steps overlapped."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.draft_policy import COOL_FIRST, COOL_MAX, MAX_WAIT, PAUSE_BELOW, PROMISING, DraftPolicy
from engine.core.sequence import Sequence


def policy(cost: float = 1.0) -> DraftPolicy:
    return DraftPolicy(2, 4, 4, lambda n, q: cost)


def test_a_sequence_whose_lookups_miss_waits_twice_as_long_each_time() -> None:
    p, seq = policy(), Sequence(0, token_ids=[1, 2, 3, 4, 5, 6])
    looked = [step for step in range(200) if p.state(seq).next_lookup <= step
              and p.propose(seq, 4, step) == []]
    gaps = [b - a for a, b in zip(looked, looked[1:], strict=False)]
    assert gaps[:7] == [1, 2, 3, 5, 9, 17, 33] and max(gaps) == MAX_WAIT + 1
    seq.token_ids += [5, 6]  # the tail repeats now: the next lookup finds it
    step = p.state(seq).next_lookup
    draft = p.propose(seq, 4, step)
    assert draft == [5, 6, 5, 6]
    assert p.choose([(seq, draft)], 1, step) and p.state(seq).wait == 0  # taken: no wait


def test_a_step_drafts_only_where_the_expected_kept_tokens_pay_for_the_verification() -> None:
    seqs = [Sequence(i) for i in range(8)]
    one = [(seqs[0], [1, 2, 3, 4])]  # expected to keep 0.5 x 4 = 2 tokens
    assert policy(1.0).pays(one, 8)  # a verification that costs nothing more: any draft pays
    assert policy(1.2).pays(one, 1)  # one sequence: 3 tokens for 1.2 steps
    assert not policy(1.3).pays(one, 8)  # 8 + 2 tokens for the price of 10.4
    assert policy(1.3).pays([(s, [1, 2, 3, 4]) for s in seqs], 8)  # 24 for 10.4
    assert not policy(1.0).pays([], 8)


def test_a_draft_with_nothing_kept_lowers_the_expected_share_and_pauses() -> None:
    p, seq = policy(), Sequence(0)
    for _ in range(6):
        p.verified(seq, 4, 0, step=10)
    assert p.state(seq).rate < PAUSE_BELOW and p.state(seq).paused_until > 11


def test_a_sequence_whose_drafts_keep_being_rejected_stops_drafting_for_longer_each_time() -> None:
    p, seq = policy(), Sequence(0, token_ids=[5, 6, 7, 5, 6, 7, 5, 6])
    drafted_at = []
    for step in range(600):
        draft = p.propose(seq, 4, step)
        if draft and p.choose([(seq, draft)], 1, step):
            drafted_at.append(step)
            p.verified(seq, len(draft), 0, step)  # sampling rejects what the lookup copies
    gaps = [b - a for a, b in zip(drafted_at, drafted_at[1:], strict=False)]
    # one rejected draft: the next step but one; two in a row: a pause, twice as long each time
    assert gaps[:5] == [1, COOL_FIRST + 1, 2 * COOL_FIRST + 1, 4 * COOL_FIRST + 1, 8 * COOL_FIRST + 1]
    assert max(gaps) == COOL_MAX + 1 and len(drafted_at) < 12  # in 600 steps
    step = drafted_at[-1] + COOL_MAX + 1
    for _ in range(3):  # its text is drafted well again: the pauses end
        p.verified(seq, 4, 4, step)
    assert p.state(seq).cool == 0 and p.state(seq).rate > 0.5
    assert p.propose(seq, 4, step + 1)


def test_drafts_a_step_does_not_take_are_compared_with_what_came_and_teach_the_rate() -> None:
    """At a batch where drafts do not pay, nothing is verified, yet each sequence learns from its
    unverified draft (its shadow): text that goes elsewhere pauses its lookups, text that
    follows the draft makes it promising, so the batch drafts once enough of it is."""
    p = policy(3.5)  # a verification costing 3.5 decode steps: 2 tokens a draft never pay
    wild = [Sequence(i, token_ids=[5, 6, 7, 5, 6, 7, 5, 6]) for i in range(8)]
    looked = 0
    for step in range(64):
        drafts = [(s, d) for s in wild if (d := p.propose(s, 4, step))]
        looked += len(drafts)
        assert p.choose(drafts, len(wild), step) == []
        for s in wild:
            s.token_ids.append(100 + step)  # never what the lookup copied
    assert looked <= 8 * 6  # a lookup or two, then the back-off of lookups that miss
    assert all(p.state(s).rate < PROMISING and p.state(s).shadow is None for s in wild)

    p = policy(4.0)  # 2 tokens a draft at the prior rate do not pay; 3.3 of a learned loop do
    loops = [Sequence(i, token_ids=[5, 6, 7, 5, 6, 7, 5, 6]) for i in range(8)]
    drafted_at = None
    for step in range(12):
        drafts = [(s, d) for s in loops if (d := p.propose(s, 4, step))]
        if p.choose(drafts, len(loops), step):
            drafted_at = step
            break
        for s in loops:
            s.token_ids.append(s.token_ids[-3])  # the loop goes on: each shadow comes true
    assert drafted_at is not None and p.state(loops[0]).rate > 0.7  # learned without a verification


def test_a_sequence_in_flight_asks_for_a_lookup_only_where_its_known_tail_repeats() -> None:
    p = policy()
    prose = Sequence(0, token_ids=[1, 2, 3, 4, 5, 6, -1])  # its last token still on the device
    assert not any(p.wants_lookup([prose], step) for step in range(40))
    assert p.state(prose).wait == MAX_WAIT  # and it looked up less and less often
    loop = Sequence(1, token_ids=[7, 8, 9, 7, 8, 9, 7, 8, -1])
    assert p.wants_lookup([loop], 0)
    # in a step of 64 decodes one looping sequence's draft would not pay a verification
    assert not policy(1.5).wants_lookup([Sequence(2, token_ids=loop.token_ids)], 0, 64)
    rejected = Sequence(3, token_ids=loop.token_ids)
    p.verified(rejected, 4, 0, step=0)
    p.verified(rejected, 4, 0, step=0)  # two drafts rejected in a row: it is paused
    assert not p.wants_lookup([rejected], 1)


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


def _drafting_steps(cost, params: SamplingParams, n: int = 64) -> tuple[int, int]:
    """(steps that verified drafts, steps) of n requests of a repetitive prompt in the dry mode,
    whose picks are random: the lookup finds drafts that sampling rejects."""
    eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=n * 8 + 16,
                                 max_num_seqs=n, speculative_method="ngram",
                                 num_speculative_tokens=4, prompt_lookup_min=1))
    eng.scheduler.drafting.cost = cost
    for i in range(n):
        eng.add_request("one two three four " * 4 + str(i), params)
    drafting = steps = 0
    while eng.has_pending_work():
        result = eng.step()
        steps += 1
        drafting += any(e.kind == "draft" for e in result.events)
    return drafting, steps


def test_drafts_that_sampling_rejects_soon_stop_at_a_batch_where_verification_costs() -> None:
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=1, ignore_eos=True)
    # a verification of 64 sequences costing two decode steps (a GPU's lost overlap): after the
    # first rejected drafts no step drafts again; one sequence alone drafts now and then
    drafting, steps = _drafting_steps(lambda n, q: 2.0 if n > 8 else 1.2, params)
    assert 0 < drafting <= 2 and steps >= 64
    # a verification costing little more than a decode (its graph's time alone): the rejected
    # sequences pause, 8, 16, 32 steps, instead of drafting every other step
    cheap, _ = _drafting_steps(lambda n, q: 1.3, params)
    assert 0 < cheap <= 5
    alone, _ = _drafting_steps(lambda n, q: 1.2, params, n=1)
    assert 0 < alone <= 5  # paused 8, 16, 32 steps after each rejection: not every other step


def test_only_sequences_with_drafting_to_do_are_due() -> None:
    """New to drafting, a shadow to compare, or free to look up: due. Backing off after a
    miss or cooling down after rejected drafts: skipped without a look."""
    p = policy()
    new, free, missed, paused, shadowed = (Sequence(i, token_ids=[1, 2, 3, 4, 5, 6]) for i in range(5))
    for s in (free, missed, paused, shadowed):
        p.state(s)
    p.propose(missed, 4, 0)
    p.propose(missed, 4, 1)  # two misses: it waits two steps
    p.verified(paused, 4, 0, step=0)
    p.verified(paused, 4, 0, step=0)  # two drafts rejected: it cools down
    p.state(shadowed).shadow = (6, (7, 8))
    p.state(shadowed).next_lookup = 99
    assert p.due([new, free, missed, paused, shadowed], 2) == [new, free, shadowed]
    assert missed in p.due([missed], p.state(missed).next_lookup)


def test_a_step_skips_the_sequences_that_wait_or_cool_down(monkeypatch) -> None:
    """64 sampled sequences whose drafts sampling rejects: most of them wait or cool down at any
    step, and the policy looks at those that do not (a step drafting nothing costs what one
    without drafts does), the tokens those of the engine without drafts."""
    visits = []
    state = DraftPolicy.state
    monkeypatch.setattr(DraftPolicy, "state", lambda self, seq: visits.append(seq) or state(self, seq))
    params = SamplingParams(max_tokens=64, temperature=1.0, seed=1, ignore_eos=True)
    drafting, steps = _drafting_steps(lambda n, q: 2.0 if n > 8 else 1.2, params)
    assert 0 < drafting <= 2
    assert 0 < len(visits) < 0.3 * 64 * steps  # a visit to every sequence every step before


def test_drafts_found_before_a_token_in_flight_count_as_likely_as_their_first_token() -> None:
    """A draft found from the tail before the token in flight guesses that token first: the
    landing it asks for pays only at the rate squared. At a GPU's cost of a verification
    (2.5 decode steps, its lost overlap included) 64 sequences at the prior rate do not land
    a step; once their drafts are mostly kept they do."""
    p = policy(2.5)
    loops = [Sequence(i, token_ids=[7, 8, 9, 7, 8, 9, 7, 8, -1]) for i in range(64)]
    assert not p.wants_lookup(loops, 0, 64)
    learned = policy(2.5)
    for s in loops:
        for _ in range(3):
            learned.verified(s, 4, 4, step=0)
    assert learned.wants_lookup(loops, 1, 64)


def test_sampled_text_under_async_scheduling_lands_no_step_for_drafts_it_would_not_take() -> None:
    """The dry mode's random picks at a GPU's cost of a verification: lookups find drafts
    (one matching token drafts), sampling would reject them, and no step gives up its overlap
    for them; the tokens are those without drafts."""
    def run(spec: dict) -> tuple[int, int, list]:
        eng = LLMEngine(EngineConfig(model=None, block_size=16, num_gpu_blocks=64 * 8 + 16,
                                     max_num_seqs=64, async_scheduling=True, **spec))
        if spec:
            eng.scheduler.drafting.cost = lambda n, q: 2.5
        params = SamplingParams(max_tokens=48, temperature=1.0, seed=1, ignore_eos=True)
        for i in range(64):
            eng.add_request("one two three four " * 4 + str(i), params)
        landed = steps = 0
        outs = {}
        while eng.has_pending_work():
            result = eng.step()
            steps += 1
            landed += eng._flight.launched is None and result.num_decodes > 0
            outs.update({o.request_id: o.outputs[0].token_ids for o in result.finished})
        return landed, steps, [outs[r] for r in sorted(outs)]

    plain_landed, _, plain = run({})
    landed, steps, got = run({**SPEC, "prompt_lookup_min": 1})
    assert got == plain and steps > 48
    assert landed == plain_landed  # the last step's only: no landing for a draft
