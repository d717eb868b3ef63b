"""Speculative decoding's bookkeeping, in the dry mode (no model, so thousands of steps are
cheap): what a prompt lookup drafts, and that drafts change no output and break no invariant
whatever else runs beside them (primitives' fork and free, preemption by swap or recompute,
chunked prefill, async scheduling, the prefix cache)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine import EngineConfig, LLMEngine, OutOfBlocks, SamplingParams
from engine.core import draft_policy
from engine.core.ngram_index import NgramIndex
from engine.core.speculation import accepted_prefix
from engine.describe.narration import narrate
from tests.engine.test_async_scheduling import dry_sampling, run, same_outputs

SPEC = {"speculative_method": "ngram", "num_speculative_tokens": 4}


def propose_ngram(tokens: list[int], k: int, n_min: int, n_max: int, chain: int = 64) -> list[int]:
    """What a fresh index of the tokens proposes (the engine's keeps one per sequence)."""
    return NgramIndex(n_min, n_max, chain).propose(list(tokens), len(tokens), k)


def test_a_lookup_drafts_what_followed_the_latest_earlier_occurrence() -> None:
    #        0  1  2  3  4  5  6  7  8  9
    text = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2]
    assert propose_ngram(text, 3, 2, 4) == [3, 7, 1]  # [1, 2] last seen at 4: 3, 7, 1 followed
    assert propose_ngram(text, 1, 2, 4) == [3]
    assert propose_ngram([5, 6, 7, 8], 4, 2, 4) == []  # nothing repeats
    assert propose_ngram([4, 4, 4], 4, 2, 2) == [4, 4, 4, 4]  # a loop goes on looping
    # "red, " twice: the latest occurrence is one period back; the draft repeats the period
    assert propose_ngram([9, 5, 6, 5, 6], 4, 2, 2) == [5, 6, 5, 6]


def test_the_longest_matching_tail_wins() -> None:
    # the last 3 tokens [1, 2, 3] occur once at 0 (followed by 8); [2, 3] alone last at 5 (by 6)
    text = [1, 2, 3, 8, 9, 2, 3, 6, 1, 2, 3]
    assert propose_ngram(text, 1, 2, 3) == [8]
    assert propose_ngram(text, 1, 2, 2) == [6]


def _lookup_by_hand(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[len(tokens) - n:]:
                run = tokens[start + n:]  # what followed, repeating where it reaches the end
                return [run[j % len(run)] for j in range(k)]
    return []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.sampled_from([0, 1, 2, 255, 256, 0xD800, 65536, 0x10FFFF]), max_size=40),
       k=st.integers(1, 6), n_min=st.integers(1, 3), extra=st.integers(0, 3))
def test_the_lookup_finds_what_a_search_by_hand_finds(tokens, k, n_min, extra) -> None:
    """The index (its chain as long as the occurrences) agrees with the obvious loop, whatever
    width the ids' characters take in the mirror (one byte, two, a surrogate's, four)."""
    assert propose_ngram(tokens, k, n_min, n_min + extra) == \
        _lookup_by_hand(tokens, k, n_min, n_min + extra)


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.sampled_from([0, 1, 2, 3]), min_size=1, max_size=60),
       cuts=st.lists(st.integers(1, 60), max_size=6), k=st.integers(1, 5))
def test_an_index_grown_step_by_step_proposes_what_a_fresh_one_does(tokens, cuts, k) -> None:
    """The engine's index grows with the sequence (a few tokens a step, drafts never indexed):
    at every length it proposes what an index built at once on the same tokens would."""
    grown = NgramIndex(2, 4)
    for end in sorted({min(c, len(tokens)) for c in cuts} | {len(tokens)}):
        assert grown.propose(tokens, end, k) == NgramIndex(2, 4).propose(tokens, end, k)


def test_a_lookup_walks_at_most_chain_occurrences() -> None:
    """On text that loops, a lookup stops after `chain` occurrences of the tail's n_min tokens
    (the longest match among the latest of them wins): its work per step is bounded."""
    text = [7, 8, 1, 2, 3] + [9, 1, 2, 4] * 20 + [7, 8, 1, 2]
    assert propose_ngram(text, 2, 2, 4, chain=64) == [3, 9]  # the whole tail [7, 8, 1, 2], far back
    assert propose_ngram(text, 2, 2, 4, chain=8) == [4, 7]  # among the latest 8: [1, 2] at best


def _capped_by_hand(tokens: list[int], k: int, n_min: int, n_max: int, chain: int) -> list[int]:
    """The rule with a cap, by hand: among the latest `chain` earlier occurrences of the tail's
    n_min tokens, the one whose match reaches furthest back (up to n_max; the latest among
    equals) gives the draft."""
    end, tail = len(tokens), tokens[len(tokens) - n_min:]
    starts = [s for s in range(end - n_min - 1, -1, -1) if tokens[s:s + n_min] == tail][:chain]
    best, best_len = -1, 0
    for s in starts:
        m = n_min
        while m < n_max and s - (m - n_min) - 1 >= 0 and \
                tokens[s - (m - n_min) - 1] == tokens[end - m - 1]:
            m += 1
        if m > best_len:
            best, best_len = s + n_min, m
    if best < 0 or end <= n_min:
        return []
    run = tokens[best:]
    return [run[j % len(run)] for j in range(k)]


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.sampled_from([0, 1, 2]), max_size=50), k=st.integers(1, 5),
       n_min=st.integers(1, 2), extra=st.integers(0, 3), chain=st.integers(1, 4))
def test_a_capped_lookup_is_the_rule_by_hand(tokens, k, n_min, extra, chain) -> None:
    assert propose_ngram(tokens, k, n_min, n_min + extra, chain) == \
        _capped_by_hand(tokens, k, n_min, n_min + extra, chain)


def test_an_id_no_character_can_be_is_refused_by_name() -> None:
    index = NgramIndex(1, 2)
    assert index.propose([5, 6, 5], 3, 2) == [6, 5]
    with pytest.raises(ValueError, match=r"token id -1 cannot be looked up"):
        index.propose([5, 6, 5, 6, -1], 5, 2)  # the placeholder of a token still on the device
    assert index.propose([5, 6, 5, 6], 4, 2) == [5, 6]  # what it had mirrored is still there


def test_a_draft_is_kept_up_to_the_first_pick_that_differs() -> None:
    assert accepted_prefix([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accepted_prefix([5, 6, 7], [5, 9, 7, 8]) == 1
    assert accepted_prefix([5, 6, 7], [4, 6, 7, 8]) == 0


def test_bad_speculation_settings_say_what_to_fix() -> None:
    import pytest

    for bad, match in [({"speculative_method": "eagle"}, "speculative_method"),
                       ({**SPEC, "num_speculative_tokens": 0}, "num_speculative_tokens"),
                       ({**SPEC, "num_speculative_tokens": 99}, "num_speculative_tokens"),
                       ({**SPEC, "prompt_lookup_min": 5}, "must not exceed")]:
        with pytest.raises(ValueError, match=match):
            EngineConfig(model=None, num_gpu_blocks=8, **bad)


REPETITIVE = st.builds(lambda unit, times, tail: unit * times + tail,
                       st.text("abc", min_size=1, max_size=5), st.integers(1, 5),
                       st.text("abcd", max_size=4))
requests = st.lists(st.tuples(REPETITIVE, dry_sampling(14, [1, 1, 2])), min_size=1, max_size=6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=requests, blocks=st.integers(12, 40), budget=st.sampled_from([6, 16, 2048]),
       swap=st.booleans(), prefix=st.booleans(), overlap=st.booleans(), k=st.integers(1, 5),
       shortest=st.sampled_from([1, 2]), window=st.sampled_from([None, None, 5]))
def test_drafts_change_no_output(work, blocks, budget, swap, prefix, overlap, k, shortest,
                                 window) -> None:
    """The dry model's picks depend on the output position only (greedy: the same token; sampled:
    the request's random number there), so a draft is kept exactly when the engine without
    drafts would have written that token: the outputs must be identical (with a hybrid's two
    block tables, full and sliding, too)."""

    def engine(spec: bool) -> LLMEngine:
        return LLMEngine(EngineConfig(
            model=None, block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=budget,
            preemption_mode="swap" if swap else "recompute", num_cpu_blocks=64 if swap else 0,
            enable_prefix_caching=prefix, async_scheduling=overlap, sliding_window=window,
            **({"speculative_method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": shortest} if spec else {})))

    eng = engine(True)
    assert same_outputs(run(eng, work), run(engine(False), work))
    m = eng.snapshot().metrics
    assert 0 <= m.accepted_tokens <= m.draft_tokens


def test_dry_drafts_reserve_slots_and_rejected_ones_give_blocks_back(monkeypatch) -> None:
    """Dry picks are random letters; a one-token lookup drafts often and is mostly wrong:
    rejected slots are rolled back, blocks holding only rejected tokens go back to the pool.
    (The policy's pauses after rejected drafts are off here: the subject is the slots.)"""
    monkeypatch.setattr(draft_policy, "COOL_FIRST", 0)
    monkeypatch.setattr(draft_policy, "COOL_MAX", 0)
    eng = LLMEngine(EngineConfig(model=None, block_size=2, num_gpu_blocks=200, seed=1,
                                 **{**SPEC, "prompt_lookup_min": 1}))
    eng.add_request("abcdefghijklm", SamplingParams(max_tokens=150, temperature=0.9))
    events, out = [], None
    while out is None:
        result = eng.step()
        eng.check_invariants()
        events += result.events
        out = result.finished[0] if result.finished else None
    m = eng.snapshot().metrics
    drafts = [e for e in events if e.kind == "draft" and e.form != "draft_kept"]
    rejects = [e for e in events if e.kind == "reject"]
    assert len(drafts) > 20 and m.draft_tokens == sum(len(e.token_ids) for e in drafts)
    assert 0 < m.accepted_tokens < m.draft_tokens == out.draft_tokens
    assert any(e.block_ids for e in rejects)  # a block of rejected tokens only: freed
    assert all(e.facts.accepted < e.facts.drafted for e in rejects)
    assert "draft" in narrate(drafts[0]) and "rolled back" in narrate(rejects[0])
    assert len(out.outputs[0].token_ids) == 150
    assert m.used_blocks == 0


class SpeculationMachine(RuleBasedStateMachine):
    """Requests that draft, beside primitives that fork and free, in pools small enough to
    preempt; every invariant after every operation, and no draft slot outlives its step."""

    @initialize(blocks=st.integers(6, 24), swap=st.booleans(), prefix=st.booleans(),
                k=st.integers(1, 6), bs=st.sampled_from([1, 2, 4, 8]), tier=st.sampled_from([0, 2, 8]))
    def setup(self, blocks, swap, prefix, k, bs, tier):
        self.eng = LLMEngine(EngineConfig(
            model=None, block_size=bs, num_gpu_blocks=blocks, enable_prefix_caching=prefix,
            num_offload_blocks=tier,
            preemption_mode="swap" if swap else "recompute", num_cpu_blocks=16 if swap else 0,
            speculative_method="ngram", num_speculative_tokens=k, prompt_lookup_min=1,
            max_num_batched_tokens=24))

    @rule(prompt=REPETITIVE, m=st.integers(1, 20), t=st.sampled_from([0.0, 0.9]),
          n=st.sampled_from([1, 2]))
    def add_request(self, prompt, m, t, n):
        try:
            self.eng.add_request(prompt, SamplingParams(max_tokens=m, temperature=t, n=n))
        except ValueError:
            pass  # longer than the pool: refused, nothing changed (invariants say so)

    @rule()
    def step(self):
        self.eng.step()

    @rule(prompt=REPETITIVE)
    def add_sequence(self, prompt):
        try:
            self.eng.add_sequence(prompt)
        except (OutOfBlocks, ValueError):
            pass  # the pool is full or too small: refused, nothing changed

    @precondition(lambda self: self._primitives())
    @rule(data=st.data())
    def fork_or_free(self, data):
        seq = data.draw(st.sampled_from(self._primitives()))
        if data.draw(st.booleans()):
            self.eng.fork(seq)
        else:
            self.eng.free(seq)

    def _primitives(self) -> list[int]:
        return sorted(s.seq_id for s in self.eng.seqs.values() if s.request_id is None)

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "eng"):
            self.eng.check_invariants()
            m = self.eng.snapshot().metrics
            assert 0 <= m.accepted_tokens <= m.draft_tokens


SpeculationMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=30,
                                                deadline=None)
TestSpeculationMachine = SpeculationMachine.TestCase
