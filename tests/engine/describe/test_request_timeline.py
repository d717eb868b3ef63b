"""The request timeline (engine/describe/request_timeline.py) against the scheduler, step by step.

The timeline is folded from the steps' events. The oracle here reads none of them: after every
step it takes what the engine says through other doors (each request's queue and preemption
count from `requests()`, each sequence's tokens and prompt left from the snapshot, the finished
outputs and the draft counters) and works out what each request must have done, then compares
that with the timeline's cell. Workloads: chunked prefill, preemption by swap and by recompute
(swap space too small for some groups), drafts, a beam group, samples, staggered arrivals and a
CPU tier of the prefix cache."""

from __future__ import annotations

import pickle

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.describe.request_timeline import STATES

REPEAT = "abcabcabcabcabcabc"


def _engine(mode: str, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=26, preemption_mode=mode,
                                  max_num_batched_tokens=10, speculative_method="ngram",
                                  num_speculative_tokens=3, prompt_lookup_min=1, **kw))


def _workload(eng: LLMEngine) -> dict[int, list]:
    """Requests arriving over the first steps; returns the per-step comparisons' failures."""
    arrivals = {0: [("a long prompt that goes in chunks " * 2, SamplingParams(max_tokens=8)),
                    (REPEAT, SamplingParams(max_tokens=14, temperature=0.9, ignore_eos=True))],
                2: [("beams please", SamplingParams(max_tokens=9, beam_width=3))],
                3: [("three samples", SamplingParams(max_tokens=10, n=3, temperature=1.0, seed=3))],
                5: [(REPEAT + "xyz", SamplingParams(max_tokens=12, ignore_eos=True)),
                    ("a long prompt that goes in chunks again", SamplingParams(max_tokens=6))]}
    seen: dict[int, list] = {}
    for i in range(200):
        for prompt, params in arrivals.get(i, ()):
            eng.add_request(prompt, params)
        if i > max(arrivals) and not eng.has_pending_work():
            break
        before = {r.request_id: r for r in eng.requests()}
        snap0 = eng.snapshot()
        result = eng.step()
        eng.check_invariants()
        seen[result.step] = [before, snap0, result, {r.request_id: r for r in eng.requests()},
                             eng.snapshot()]
    return seen


def _expected(rid, before, snap0, result, after, snap1):
    """(state, tokens or None, detail or None) this request must show in this step."""
    done = {o.request_id: o for o in result.finished}
    if rid in done:
        out = done[rid]
        return "finished", None, out.outputs[0].finish_reason if out.outputs else "abort"
    if rid not in after:
        return None, None, None
    r0, r1 = before.get(rid), after[rid]
    preempted = r0 is not None and r1.num_preemptions > r0.num_preemptions
    if r1.status == "swapped":
        return ("preempt_swap" if preempted else "swapped"), None, None
    if r1.status == "waiting":
        return ("preempt_recompute" if preempted else "waiting"), None, None
    if r1.status == "loading":
        return "loading", None, None
    seqs0, seqs1 = snap0.sequences, snap1.sequences
    live = [s for s in r1.live_seq_ids if s in seqs1]
    # a prompt (or a recompute) starts from the waiting queue or the CPU tier, or goes on from
    # an earlier chunk; a fork's child (not there before) shares its parent's step
    was_queued = r0 is not None and r0.status in ("waiting", "loading")
    prefilling = [s for s in live if s in seqs0 and (was_queued or seqs0[s].prefill_rest)]
    if prefilling and any(seqs1[s].num_tokens > seqs0[s].num_tokens for s in prefilling):
        s = prefilling[0]
        rest = seqs1[s].prefill_rest
        fresh = seqs0[s].num_tokens == 0 or r0.status == "waiting"
        computed = seqs1[s].num_tokens - (seqs1[s].num_cached_tokens if fresh else
                                          seqs0[s].num_tokens)
        # every chunk of a re-prefill after a preemption by recompute is labelled "recompute"
        # (a request that had sampled keeps its pending token while it computes its text again)
        again = seqs1[s].pending_token is not None
        return "prefill", (computed if len(live) == 1 else None), (
            "recompute" if rest and again else f"{rest} to go" if rest else None)
    if all(s in seqs0 for s in live):  # one sequence, or samples (beams fork every step)
        grew = [seqs1[s].num_tokens - seqs0[s].num_tokens for s in live]
        if not any(grew):
            return "stalled", 0, None
        return ("draft" if max(grew) > 1 else "decode"), sum(grew), None
    return "decode", len(r0.live_seq_ids) if r0 else None, None


@pytest.mark.parametrize("mode,extra", [("swap", {"num_cpu_blocks": 7}),
                                        ("recompute", {"num_offload_blocks": 8})])
def test_every_cell_is_what_the_scheduler_did(mode, extra):
    eng = _engine(mode, **extra)
    seen = _workload(eng)
    timeline = eng.request_timeline()
    assert list(timeline.columns) == sorted(seen)
    grid = timeline.grid()
    states = set()
    for lane, row in zip(timeline.lanes, grid, strict=True):
        for col, cell in zip(timeline.columns, row, strict=True):
            before, snap0, result, after, snap1 = seen[col]
            if lane.request_id not in before and lane.request_id not in after and cell is None:
                continue  # not arrived yet, or over
            state, tokens, detail = _expected(lane.request_id, *seen[col])
            got = cell.state if cell else None
            if state == "decode" and got == "draft" and cell.drafted and cell.tokens == tokens:
                state = "draft"  # drafted, kept none: only the pick, as a decode (drafts: below)
            assert got == state, (mode, lane.request_id, col, cell, state)
            if tokens is not None and got in ("prefill", "decode", "draft", "stalled"):
                assert cell.tokens == tokens, (mode, lane.request_id, col, cell, tokens)
            if detail is not None:
                assert detail in cell.detail, (mode, lane.request_id, col, cell, detail)
            states.add(got)
    # the drafts: every drafted and kept token of every step, summed over the requests
    for col, step_cells in zip(timeline.columns, timeline.steps, strict=True):
        snap0, snap1 = seen[col][1], seen[col][4]
        cells = step_cells.requests.values()
        drafted = snap1.metrics.draft_tokens - snap0.metrics.draft_tokens
        accepted = snap1.metrics.accepted_tokens - snap0.metrics.accepted_tokens
        assert sum(c.drafted for c in cells) == drafted, col
        kept = [c.tokens - 1 for c in step_cells.seqs.values() if c.state == "draft"]
        assert sum(kept) == accepted, col
    wanted = {"waiting", "prefill", "decode", "draft", "finished"} | (
        {"preempt_swap", "swapped"} if mode == "swap" else
        {"preempt_recompute", "stalled", "loading"})  # a chunk without budget; the CPU tier
    assert wanted <= states, wanted - states


def test_sample_and_beam_lanes_open_into_their_sequences():
    eng = _engine("swap", num_cpu_blocks=7)
    _workload(eng)
    timeline = eng.request_timeline()
    beams = next(ln for ln in timeline.lanes if ln.kind == "beams")
    samples = next(ln for ln in timeline.lanes if ln.kind == "samples")
    assert samples.width == 3 and len(samples.seq_ids) == 3
    assert samples.parents == (None, samples.seq_ids[0], samples.seq_ids[0])
    assert len(beams.seq_ids) > beams.width  # beams fork and drop every step
    for lane in (beams, samples):
        rows = dict(timeline.seq_grid(lane.request_id))
        request_row = timeline.grid()[timeline.lanes.index(lane)]
        last = max(i for i, c in enumerate(request_row) if c is not None)
        assert request_row[last].state == "finished"
        for sid, parent, born in zip(lane.seq_ids, lane.parents, lane.born, strict=True):
            row = rows[sid]
            first = next(i for i, c in enumerate(row) if c is not None)
            if parent is not None:  # a fork's child starts in the step it was made
                assert timeline.columns[first] == born
                assert row[first].detail == f"forked from seq {parent}"
            ended = max(i for i, c in enumerate(row) if c is not None)
            assert row[ended].state in ("freed", "finished") and ended <= last
        finished = [sid for sid, row in rows.items() if row[last] and row[last].state == "finished"]
        assert finished, "the request's last sequences end with it"


def test_the_record_survives_checkpoints_replay_and_pickling():
    eng = _engine("recompute", num_offload_blocks=8)
    for p in ("one prompt here", REPEAT):
        eng.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
    for _ in range(3):
        eng.step()
    cp = eng.checkpoint()
    first = eng.request_timeline().grid()
    for _ in range(4):
        eng.step()
    full = eng.request_timeline()
    assert full.upto(cp.position).grid() == first
    replay = LLMEngine.replay(eng.config, eng.trace)
    assert replay.request_timeline().grid() == full.grid()
    eng.restore(cp)
    assert eng.request_timeline().grid() == first
    assert pickle.loads(pickle.dumps(full)).grid() == full.grid()
    assert all(c is None or c.state in STATES for row in full.grid() for c in row)


def test_a_recompute_in_the_middle_of_the_first_prefill_is_a_recompute():
    """Issue 42, item 12: a request preempted by recompute while its first (chunked) prefill ran
    came back as a fresh prompt: its prompt was counted twice in memory over time, the hits on
    its own recomputed blocks counted as the prompt's prefix hits, and neither the timeline nor
    the narration called that prefill a recompute."""
    from engine.describe import narrate
    from engine.describe.memory_use import memory_point

    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=11,
                                 max_num_batched_tokens=8))
    eng.add_request("x" * 4, SamplingParams(max_tokens=30, ignore_eos=True))
    eng.step()
    prompt = "the quick brown fox jumps over the lazy"  # 39 tokens: five chunks of the budget
    rid = eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    points, prefills, preempted = [], [], False
    while eng.has_pending_work():
        result = eng.step()
        points.append(memory_point(eng.snapshot(), result.events))
        for e in result.events:
            preempted |= e.kind == "preempt" and e.facts.request_id == rid
            if e.kind == "prefill" and e.seq_id == 1:
                prefills.append((result.step, preempted, e.facts.resumed, narrate(e)))
    assert preempted and any(done for _, done, _, _ in prefills)  # preempted mid-prefill, then back
    assert prefills[0][1] is False and prefills[-1][1] is True  # the first prefill had not ended
    for step, after, recompute, text in prefills:
        assert recompute is after, (step, text)
        assert ("recompute" in text) is after, text
    assert sum(p.prompt_tokens for p in points) == len(prompt)  # the prompt counted once
    assert sum(p.hit_tokens for p in points) == 0  # nothing of it came from another request
    cells = {s.step: s.seqs[1] for s in eng.request_timeline().steps if 1 in s.seqs}
    for step, after, _, _ in prefills:  # each chunk after the preemption, and none before
        assert cells[step].detail.startswith("recompute") is after, cells[step]
