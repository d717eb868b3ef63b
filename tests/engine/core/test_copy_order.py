"""A step's block copies run in the order the bookkeeping made them (engine/core/copy_plan.py: the
list of `BlockCopy` it records as it makes them), and the dry engine's shadow of every KV slot
(engine/core/kv_content.py) sees a copy made out of
order: issue 36, where a swap-out overwrote CPU blocks that a swap-in of the same step had freed
but not yet read, and requests answered with another request's K/V."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams, step_run
from engine.config import TRACK_KV_CONTENT_ENV
from engine.core import copy_plan
from engine.core.copy_plan import BlockCopy
from engine.core.group_admission import allocate_together
from engine.core.invariants import InvariantError
from engine.core.sequence import Sequence
from tests.helpers import fingerprint


def swap(kind: str, *pairs: tuple[int, int]) -> list[BlockCopy]:
    return [BlockCopy(kind, src, dst) for src, dst in pairs]


def test_independent_copies_are_one_wave_with_each_kind_batched():
    copies = [BlockCopy("copy_blocks", 1, 2), *swap("swap_out", (3, 0), (4, 1)),
              BlockCopy("copy_blocks", 5, 6), *swap("swap_in", (2, 7))]
    assert copy_plan.copy_waves(copies) == [
        {"copy_blocks": [(1, 2), (5, 6)], "swap_out": [(3, 0), (4, 1)], "swap_in": [(2, 7)]}]


def test_a_swap_out_into_cpu_blocks_a_swap_in_freed_waits_for_the_swap_in():
    # the step 10: the swap-in reads CPU blocks 0..4, the swap-out then takes 1..5
    swap_in = swap("swap_in", *[(c, 10 + c) for c in range(5)])
    swap_out = swap("swap_out", *[(20 + c, c + 1) for c in range(5)])
    waves = copy_plan.copy_waves(swap_in + swap_out)
    assert [list(w) for w in waves] == [["swap_in"], ["swap_out"]]


def test_a_group_swapped_in_and_out_in_one_step_is_copied_in_before_it_is_copied_out():
    waves = copy_plan.copy_waves(swap("swap_in", (0, 7)) + swap("swap_out", (7, 3)))
    assert waves == [{"swap_in": [(0, 7)]}, {"swap_out": [(7, 3)]}]


def test_a_block_evicted_to_the_tier_is_read_before_its_new_owner_writes_it():
    offload = BlockCopy("offload", 4, 2)
    load = BlockCopy("load", 2, 4)  # the tier slot just written, into block 4
    assert copy_plan.copy_waves([offload, load]) == [{"offload": [(4, 2)]}, {"load": [(2, 4)]}]


def test_a_prompt_loaded_into_blocks_it_evicted_to_the_tier_is_one_wave():
    """The offloads run before the loads within a wave, so a load may write a block an
    offload of the wave read; anything else that writes it still waits for the next wave."""
    offloads = swap("offload", (4, 0), (5, 1))
    loads = swap("load", (7, 4), (8, 5))  # other slots, into the blocks just offloaded
    assert copy_plan.copy_waves(offloads + loads) == [
        {"offload": [(4, 0), (5, 1)], "load": [(7, 4), (8, 5)]}]
    cow = BlockCopy("copy_blocks", 9, 4)  # not a load: after the offload read block 4
    assert copy_plan.copy_waves([*offloads, cow]) == [{"offload": [(4, 0), (5, 1)]},
                                                     {"copy_blocks": [(9, 4)]}]
    again = BlockCopy("offload", 4, 3)  # block 4 read again after the load wrote it
    assert len(copy_plan.copy_waves([*offloads, *loads, again])) == 2


def test_a_long_prompt_from_the_tier_reads_back_its_own_kv(monkeypatch):
    """The document repeat (its blocks evicted to the tier, then loaded into the blocks their
    evictions freed, in one wave): every block reads back its own tokens' K/V."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=12,
                                 num_offload_blocks=32, track_kv_content=True))
    doc, other = list(range(3, 39)), list(range(100, 136))
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    waves: list = []
    monkeypatch.setattr(step_run, "copy_waves",
                        lambda copies, real=step_run.copy_waves: waves.append(real(copies)) or waves[-1])
    for r in range(3):
        eng.generate([doc + [40 + r]], one)
        eng.generate([other + [50 + r]], one)  # evicts the document's blocks into the tier
        eng.generate([doc + [60 + r]], one)
        eng.check_invariants()  # the content shadow: every slot holds its own token's K/V
    assert eng.snapshot().metrics.offload_hit_blocks > 0
    assert any(len(w) == 1 and {"offload", "load"} <= set(w[0]) for w in waves), waves


def waves_by_hand(copies: list[BlockCopy]) -> list[dict]:
    """The rule, a copy at a time: a new wave where a copy reads what the wave wrote, or writes
    what it read or wrote, except a load writing what the wave's offloads read."""
    waves, wave, read, gathered, written = [], {}, set(), set(), set()
    spaces = {"offload": ("gpu", "tier"), "swap_out": ("gpu", "cpu"), "swap_in": ("cpu", "gpu"),
              "load": ("tier", "gpu"), "copy_blocks": ("gpu", "gpu")}
    for kind, src, dst in copies:
        source, target = (spaces[kind][0], src), (spaces[kind][1], dst)
        if source in written or target in read or target in written or (
                kind != "load" and target in gathered):
            waves.append(wave)
            wave, read, gathered, written = {}, set(), set(), set()
        wave.setdefault(kind, []).append((src, dst))
        (gathered if kind == "offload" else read).add(source)
        written.add(target)
    return waves + [wave] if wave else waves


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(copy_plan.COPY_KINDS), st.integers(0, 5),
                          st.integers(0, 5)), max_size=30))
def test_copy_waves_cut_where_the_rule_by_hand_does(raw):
    """The waves are the rule's, written out here in other words (locations as pairs), whatever
    the copies hold."""
    copies = [BlockCopy(*c) for c in raw]
    assert copy_plan.copy_waves(copies) == waves_by_hand(copies)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(copy_plan.COPY_KINDS), st.integers(0, 40),
                          st.integers(1, 12), st.integers(0, 3)), max_size=6))
def test_runs_of_one_kind_cut_where_the_rule_by_hand_does(runs):
    """Long runs of one kind (a prompt's offloads, then its loads), which `copy_waves` takes
    whole when they collide with nothing: blocks from a small range, so that some do."""
    copies = [BlockCopy(kind, (first + i) % 24, (first + 7 * i + shift) % 24)
              for kind, first, n, shift in runs for i in range(n)]
    assert copy_plan.copy_waves(copies) == waves_by_hand(copies)


def test_the_bookkeeping_records_its_copies_in_the_order_it_made_them():
    """Copy-on-write and a swap of one step come out of the bookkeeping as data, in order,
    and the engine hands every one of them to the runtime (none is left after a step)."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=6, num_cpu_blocks=8,
                                 preemption_mode="swap"))
    seq = eng.add_sequence("abcdef")
    child = eng.fork(seq)
    eng.kv.step = 99
    events = eng.kv.append(eng.seqs[child], [7])
    cow = next(e for e in events if e.kind == "cow")
    assert eng.kv.take_copies() == [BlockCopy("copy_blocks", *cow.block_ids)]
    assert eng.kv.take_copies() == []
    events, pairs = eng.kv.swap_out([eng.seqs[seq]])
    assert eng.kv.take_copies() == [BlockCopy("swap_out", g, c) for g, c in pairs]


def old_fixed_order(copies):
    """The order before the fix: every kind in one batch, swap-outs before swap-ins."""
    wave: dict = {}
    for kind, src, dst in copies:
        wave.setdefault(kind, []).append((src, dst))
    return [wave] if wave else []


def classroom(seed: int, track: bool = True) -> LLMEngine:
    """The classroom's workload in the dry mode: 30 requests sharing a system prompt, arriving
    0 to 8 before each step, in a pool that must swap."""
    eng = LLMEngine(EngineConfig(model=None, block_size=8, num_gpu_blocks=20, num_cpu_blocks=6,
                                 preemption_mode="swap", track_kv_content=track))
    r = random.Random(seed)
    order = list(range(30))
    r.shuffle(order)
    while order or eng.has_pending_work():
        for _ in range(r.randint(0, 8)):
            if order:
                i = order.pop()
                eng.add_request(f"You are a tutor. Be brief. What is {i} plus {i}?",
                                SamplingParams(max_tokens=8))
        eng.step()
    eng.check_invariants()
    return eng


def test_the_content_check_catches_the_old_copy_order(monkeypatch):
    # the bookkeeping's own invariants held in these runs: only the bytes were wrong
    monkeypatch.setattr(step_run, "copy_waves", old_fixed_order)
    caught = 0
    for seed in range(40):
        try:
            classroom(seed)
        except InvariantError as e:
            assert "should hold the K/V of its token" in str(e)
            caught += 1
    assert caught >= 1


def test_the_classroom_workload_reads_back_its_own_kv_in_every_run():
    for seed in range(40):
        classroom(seed)


def test_a_resumed_group_that_does_not_fit_leaves_the_pools_exactly_as_they_were():
    """Two samples preempted by recompute come back together or not at all. The first one's
    allocation would hash blocks nobody computed (a later prompt hit on them read garbage)."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    eng.add_request("a" * 6, SamplingParams(max_tokens=12))
    eng.add_request("b" * 6, SamplingParams(max_tokens=12, n=2, temperature=1.0))
    refused = 0
    while eng.has_pending_work():
        waiting = [g for g in eng.scheduler.waiting if len(g.live()) > 1]
        if waiting and waiting[0].prefilled:
            seqs = waiting[0].live()
            before = fingerprint(eng)
            try:
                allocate_together(eng.kv, seqs, [s.resume_tokens for s in seqs])
            except Exception:  # noqa: BLE001 (the refusal is what this test wants)
                refused += 1
                assert fingerprint(eng) == before
            else:
                for s in seqs:
                    eng.kv.free(s)
                    s.token_ids = []
                break
        eng.step()
        eng.check_invariants()
    assert refused >= 1


def test_tracking_is_off_in_the_product_and_on_in_every_test(monkeypatch):
    """The oracle costs host time per token: off by default, dry mode included; tests/conftest.py
    turns it on for every test through the environment, and a config may say either."""
    assert os.environ[TRACK_KV_CONTENT_ENV] == "1"  # this very test runs with it on
    assert EngineConfig(model=None).tracks_kv_content
    assert EngineConfig(model="tiny-random").tracks_kv_content
    assert LLMEngine(EngineConfig(model=None, num_gpu_blocks=8)).content is not None
    monkeypatch.delenv(TRACK_KV_CONTENT_ENV)  # the product
    assert not EngineConfig(model=None).tracks_kv_content
    assert not EngineConfig(model="tiny-random").tracks_kv_content
    assert LLMEngine(EngineConfig(model=None, num_gpu_blocks=8)).content is None
    assert EngineConfig(model=None, track_kv_content=True).tracks_kv_content


@pytest.mark.parametrize("track", [True, False])
def test_tracking_can_be_turned_on_and_off(track):
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8, track_kv_content=track))
    assert (eng.content is not None) == track
    seq = eng.add_sequence("abcdefg")
    eng.fork(seq)
    eng.append(seq, n=3)
    eng.check_invariants()


def test_a_slot_that_holds_another_sequences_kv_is_reported():
    """The check compares what a slot's K/V were computed from, not only the token: the same
    token at the same position after a different prefix is another sequence's K/V."""
    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    a = eng.add_sequence("abcdefgh")
    b = eng.add_sequence("xbcdefgh")  # same tokens at positions 1..7, another prefix
    assert eng.block_table(a)[1] != eng.block_table(b)[1]
    eng.content.copy_blocks([(eng.block_table(b)[1], eng.block_table(a)[1])])
    with pytest.raises(InvariantError, match="another sequence's K/V"):
        eng.check_invariants()
    assert isinstance(eng.seqs[a], Sequence)
