"""The run of a serving step: the scheduled step's copies and one forward pass, then its picks.

The middle part of a step (schedule -> run -> postprocess). `execute` narrates the step's
prefills and decodes, has the runtime make the step's block copies (swaps, copy-on-write, the
CPU tier's offloads and loads: the list the bookkeeping recorded, in its order) and compute
every scheduled token (the dry runtime draws from its RNG instead); `pick` launches every token of the
step in one batched draw and every beam's candidates in one top-k, so the device is read once
for each, not once per sequence. The tokens land in engine/core/postprocess.py.
"""

from __future__ import annotations

import random
from typing import Any

from engine.core.copy_plan import BlockCopy, copy_waves, run_wave
from engine.core.events import Event, Prefilled
from engine.core.kv_content import KVContent
from engine.core.launched import Launched
from engine.core.registry import Registry
from engine.core.sampler_keys import SampleRequest, request_key, sample_uniforms
from engine.core.scheduler import PrefillItem, ScheduledStep
from engine.core.sequence import SamplingParams, Sequence, SequenceGroup
from engine.runtime.protocols import ModelRuntime, StepItem

Draw = tuple[int, SamplingParams, tuple[int, int, int] | None]


def execute(sched: ScheduledStep, events: list[Event], step: int, runtime: ModelRuntime,
            last_picks: Any, copies: list[BlockCopy], content: KVContent | None = None,
            stores: list[BlockCopy] | None = None) -> Any:
    """Run the scheduled step: its block copies (`copies`, in the order the schedule made them),
    then one forward pass, then `stores` (the tier's copies of blocks the pass computes:
    `tier_store="computed"`, queued once the pass is launched); returns its scores (None when
    it computes nothing). Under async scheduling `last_picks` holds the tokens of the step
    before, still on the device. `content`, when tracked, receives the same copies and a
    write of every computed token."""
    scores = _forward(sched, events, step, runtime, last_picks, copies, content)
    move_blocks(runtime, stores or [], content)
    return scores


def _forward(sched: ScheduledStep, events: list[Event], step: int, runtime: ModelRuntime,
             last_picks: Any, copies: list[BlockCopy], content: KVContent | None) -> Any:
    """`execute`'s copies and forward pass."""
    drafts = sched.drafts  # a drafting sequence computes its pending token and its draft
    work = [(p.seq, p.start, 1) for p in sched.prefills]
    work += [(s, len(s.token_ids) - 1 - k, 1 + k) for s in sched.decodes
             for k in (drafts.get(s.seq_id, 0),)]
    for p in sched.prefills:
        events.append(_prefill_event(p, step))
    if sched.decodes:
        events.append(Event("decode", step, None, tuple(s.seq_id for s in sched.decodes)))
    move_blocks(runtime, copies, content)
    if not work:
        return None
    if content is not None:
        for s, n, _ in work:
            content.write(s, n)
    # a query of k + 1 positions gives k + 1 rows of logits: one pick after each
    batch = items(work)
    # async scheduling: a token still on the GPU is read there, from the last step's picks
    feed = [(i, s.inflight_row) for i, (s, _, _) in enumerate(work) if s.inflight_step >= 0] \
        if last_picks is not None else None
    if feed:
        return runtime.execute(batch, feed=(feed, last_picks.tokens))
    return runtime.execute(batch)


def item(seq: Sequence, num_computed: int, num_logits: int = 1) -> StepItem:
    """One sequence's part of a forward pass: its tokens from num_computed on, its block table,
    the rows of logits it wants, the tables of its other KV cache groups, and its id (a decode
    row stays on the device under that key)."""
    return items([(seq, num_computed, num_logits)])[0]


def items(work: list[tuple[Sequence, int, int]]) -> list[StepItem]:
    """`item` of each (sequence, num_computed, num_logits), in one comprehension: made for
    every sequence of every step, each straight from its fields' tuple (a NamedTuple's own
    __new__, or a call a sequence, costs a Python call each)."""
    return [_new(StepItem, (s.token_ids[n:], n, s.block_tables[0], m, s.block_tables[1:], s.seq_id))
            for s, n, m in work]


_new = tuple.__new__


def move_blocks(runtime: ModelRuntime, copies: list[BlockCopy],
                content: KVContent | None = None) -> None:
    """The block copies the bookkeeping made, before the forward pass that reads them, in the
    order it made them (engine/core/copy_plan.py: waves of independent copies, each kind a
    batch); the content shadow, when tracked, follows the same waves."""
    if not copies:
        return
    waves = copy_waves(copies)
    for wave in waves:
        run_wave(wave, runtime)
        if content is not None:
            run_wave(wave, content)


def pick(sched: ScheduledStep, scores: Any, step: int, registry: Registry, seed: int,
         async_scheduling: bool) -> Launched | None:
    """Launch the step's picks. Under async scheduling a step whose picks decide nothing but
    tokens leaves them on the device (read when it lands). A greedy row draws no uniform where
    the scores have an argmax (`Scores.has_argmax`; the dry mode's draw all the same)."""
    if scores is None:
        return None
    greedy_free = scores.has_argmax
    rows: dict[int, list[tuple[Sequence, int]]] = {}
    fresh: set[int] = set()
    row = 0
    for p in sched.prefills:
        if p.final and not p.resumed:  # an earlier chunk's logits are not sampled
            rows.setdefault(p.group.request_id, []).append((p.seq, row))
            fresh.add(p.group.request_id)
        row += 1
    drafts = sched.drafts
    for seq in sched.decodes:
        rows.setdefault(seq.request_id, []).append((seq, row))
        row += 1 + drafts.get(seq.seq_id, 0)
    groups = registry.groups
    pending: list[Draw] = []
    counts: list[tuple[int, int]] = []  # (draws, top-k rows) per request, in rows' order
    beam_rows: list[int] = []
    beam_ks: list[int] = []
    structural = False  # do the picks fork or free sequences?
    top_p = False  # does some draw cut to a nucleus (its rare unsettled rows need the host)?
    for rid, seq_rows in rows.items():
        group = groups[rid]
        params = group.params
        if params.beam_width > 1:
            beam_rows += [r for _, r in seq_rows]
            beam_ks += [2 * params.beam_width] * len(seq_rows)
            counts.append((0, len(seq_rows)))
            structural = True
        else:
            if params.temperature == 0 and greedy_free and not drafts and (
                    params.n == 1 or rid not in fresh):  # most steps of greedy requests: no call
                mine = [(r, params, None) for _, r in seq_rows]
            else:
                mine = _draws(group, seq_rows, rid in fresh, seed, greedy_free, drafts)
            pending += mine
            counts.append((len(mine), 0))
            structural |= rid in fresh and params.n > 1
            top_p |= params.top_p < 1.0
    counters = [c for _, _, c in pending if c is not None]
    us = iter(sample_uniforms(counters).tolist() if counters else ())
    # a record a row: straight from its fields' tuple (a NamedTuple's own __new__ is a call)
    draws = [_new(SampleRequest, (r, p, 0.0 if c is None else next(us))) for r, p, c in pending]
    launched = Launched(step, rows, fresh, counts, drafts=dict(drafts))
    # a draft's verification decides the next step's lookup: read its picks now
    launched.overlap = (async_scheduling and not structural and not drafts
                        and not sched.lookup_due and not top_p and scores.can_overlap)
    if launched.overlap:
        launched.picks = scores.pick_rows(draws)
        for seq_rows in rows.values():
            for seq, r in seq_rows:
                seq.inflight_step, seq.inflight_row = launched.step, r
    else:
        launched.tokens = scores.sample_many(draws) if draws else []
        launched.tops = scores.top_many(beam_rows, beam_ks) if beam_rows else []
        if drafts:  # greedy drafts: kept or not as the device decided, read with the picks
            first = len(sched.prefills)
            for i, seq in enumerate(sched.decodes):
                if seq.seq_id in drafts and groups[seq.request_id].params.temperature == 0:
                    kept = scores.accepted(first + i)
                    if kept is not None:
                        launched.accepted[seq.seq_id] = kept
    return launched


def _draws(group: SequenceGroup, seq_rows: list[tuple[Sequence, int]], fresh: bool, seed: int,
           greedy_free: bool, drafts: dict[int, int]) -> list[Draw]:
    """What each sequence of a sampling group draws from this step: its row, its params,
    and the counter its uniform number is hashed from, (seed, its index in the group, its
    output position), or None for a greedy row (`pick` hashes the step's counters at once).
    A sequence with k drafts draws k + 1 times, at its next k + 1 output positions: each pick
    is the one the engine would make there without drafts."""
    params = group.params
    # (sequence, row, j): the pick after j of its draft tokens, at output position + j
    if drafts:
        picks = [(s, r + j, j) for s, r in seq_rows for j in range(1 + drafts.get(s.seq_id, 0))]
    else:
        picks = [(s, r, 0) for s, r in seq_rows]
    if params.temperature == 0 and greedy_free:  # greedy: no uniform to draw
        rows = [r for _, r, _ in picks] * (params.n if fresh else 1)  # n copies: forked after
        return [(r, params, None) for r in rows]
    if group.seed is None:
        given = params.seed
        if given is None:  # reproducible on replay all the same
            given = random.Random(seed * 1_000_003 + group.request_id).getrandbits(62)
        group.seed = request_key(given)
    key = group.seed
    if fresh and params.n > 1:  # the n samples of the prefill's row, forked after the draw
        row = seq_rows[0][1]
        return [(row, params, (key, i, 0)) for i in range(params.n)]
    # the output position: under async scheduling a token may still be on its way
    if params.n == 1:
        return [(r, params, (key, 0, len(s.output_ids) + j + (s.inflight_step >= 0)))
                for s, r, j in picks]
    index = {s.seq_id: i for i, s in enumerate(group.seqs)}
    return [(r, params, (key, index[s.seq_id], len(s.output_ids) + j + (s.inflight_step >= 0)))
            for s, r, j in picks]


def _prefill_event(p: PrefillItem, step: int) -> Event:
    """One prefill (whole, or a chunk of a chunked prompt) and the numbers its sentence needs."""
    seq = p.seq
    whole = p.final and p.start == seq.num_cached_tokens
    return Event("prefill", step, seq.seq_id, tuple(seq.block_table), facts=Prefilled(
        p.recompute, p.final, whole, p.start, seq.num_tokens, p.num_new_tokens,
        seq.num_cached_tokens, len(seq.prefill_rest)))
