"""Serving on top of the primitives: requests, one scheduler step, generate.

A step reads as the paper's server loop: **schedule** (scheduler.py decides decodes, prefills,
preemptions, and moves the blocks), **run** (the runtime copies swapped and copy-on-write blocks,
then one forward pass over every scheduled token), **postprocess** (sample, continue beams by
fork / free, finish requests and free their blocks).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine import ops
from engine.core.beam_search import Hypothesis, choose, length_penalised, should_stop
from engine.core.events import Event
from engine.core.outputs import CompletionOutput, LazyOutputs, RequestOutput, StepResult
from engine.core.sampler_keys import SampleRequest, request_key, sample_uniforms
from engine.core.scheduler import PrefillItem, ScheduledStep, Scheduler
from engine.core.sequence import IN_FLIGHT, SamplingParams, Sequence, SequenceGroup, SequenceStatus
from engine.dry.dry_model import DryScores


@dataclass
class Launched:
    """One step's picks on their way: which rows sample which sequences, and the tokens (read
    now, or under async scheduling a handle read when the step lands)."""

    step: int
    rows: dict[int, list[tuple[Sequence, int]]]  # request id -> (sequence, row of the step)
    fresh: set[int]  # requests whose prefill this step finished: their first token
    counts: list[tuple[int, int]]  # (draws, top-k rows) per request, in rows' order
    overlap: bool = False  # may land after the next step is launched
    picks: Any = None  # a device handle (pick_rows) under overlap
    tokens: list[tuple[int, float]] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)


class ServingMixin:
    """The serving half of LLMEngine (uses its seqs, kv, runtime, tokenizer and op log)."""

    scheduler: Scheduler

    def _init_serving(self) -> None:
        self.scheduler = Scheduler(self.config, self.kv)
        self.groups: dict[int, SequenceGroup] = {}
        self._next_request_id = 0
        self.last_step: StepResult | None = None
        self._inflight: Launched | None = None  # async scheduling: the step still on the GPU
        # what landed outside a step (before a primitive op): the next step reports it
        self._stashed_finished: list[RequestOutput] = []
        self._stashed_events: list[Event] = []
        self._last_picks: Any = None  # its picks: the next step's inputs read its tokens there

    # ---- public -------------------------------------------------------------------------------

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> int:
        """Queue a request; it joins the next step. Returns the request id."""
        return self._apply(ops.AddRequest(prompt, params))

    def step(self) -> StepResult:
        """One scheduler iteration: schedule, run, postprocess."""
        return self._apply(ops.Step())

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        """Add the prompts as requests and step until all of them finish."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        ids = [self.add_request(p, params) for p in prompts]
        done: dict[int, RequestOutput] = {}
        while any(i not in done for i in ids):
            result = self.step()
            for out in result.finished:
                done[out.request_id] = out
            if result.num_batched_tokens == 0 and not result.finished and not result.events:
                raise RuntimeError(
                    "no request can run: the pool is held by sequences outside the scheduler; "
                    "free some of them")
        return [done[i] for i in ids]

    # ---- ops ------------------------------------------------------------------------------------

    def _op_add_request(self, op: ops.AddRequest) -> tuple[int, list[Event]]:
        params = op.params
        tokens = self._prompt_tokens(op.prompt)
        bs, nb = self.config.block_size, self.kv.pool.num_blocks
        if len(tokens) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(tokens)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                             f"the {self.max_model_len} tokens this engine can hold; lower max_tokens")
        if -(-len(tokens) // bs) > nb:
            raise ValueError(f"the prompt needs {-(-len(tokens) // bs)} blocks but the pool has {nb}")
        rid = self._next_request_id
        seq = Sequence(self._next_seq_id, status=SequenceStatus.WAITING, request_id=rid)
        group = SequenceGroup(rid, op.prompt_value, tokens, params, [seq], arrival=rid)
        self._next_request_id += 1
        self._next_seq_id += 1
        self.seqs[seq.seq_id] = seq
        self.groups[rid] = group
        self.scheduler.add(group)
        return rid, []  # nothing happens to blocks until a step schedules it

    def _op_step(self, op: ops.Step) -> tuple[StepResult, list[Event]]:
        events, self._stashed_events = self._stashed_events, []
        finished, self._stashed_finished = self._stashed_finished, []
        inflight = self._inflight
        if inflight is not None and not self._can_overlap(inflight):
            finished += self._land(inflight, events)           # the last step's tokens, first
            inflight = None
        sched = self.scheduler.schedule()                      # schedule
        events += sched.events
        scores = self._run_step(sched, events)                 # run
        launched = self._pick(sched, scores)                   # sample (on the device)
        if inflight is not None:  # async: the step before lands while this one computes
            finished += self._land(inflight, events)
        self._inflight = None
        if launched is not None and launched.overlap:
            self._inflight = launched
        elif launched is not None:
            finished += self._land(launched, events)           # postprocess
        for group in sched.aborted:
            finished.append(self._finish_group(group, events, aborted=True))
        result = StepResult(self.kv.step, events, finished, self._lazy_outputs(), sched.num_tokens,
                            len(sched.prefills), len(sched.decodes))
        self.last_step = result
        return result, events

    def _can_overlap(self, inflight: Launched) -> bool:
        """May the next step be scheduled before `inflight`'s tokens are read? Not when they
        decide forks and frees (beams, the n samples of a prefill), and not when the next step
        could preempt: a preempted sequence must not have a token on its way. A decode takes
        at most one block a sequence, so enough free blocks for all of them rule that out."""
        sched = self.scheduler
        if not inflight.overlap or sched.swapped:
            return False
        free = self.kv.pool.num_allocatable
        if free >= sched.num_running_seqs:
            return True
        # a fuller pool: count what the next decode pass takes (one pass over the sequences)
        needed = self.kv.blocks_needed_to_append
        return sum(needed(s, 1) for g in sched.running for s in g.live()) <= free

    def _land_in_flight(self, events: list[Event]) -> list[RequestOutput]:
        """Read back and postprocess the step still on the GPU, if any (async scheduling)."""
        inflight, self._inflight = self._inflight, None
        return self._land(inflight, events) if inflight is not None else []

    # ---- run ------------------------------------------------------------------------------------

    def _run_step(self, sched: ScheduledStep, events: list[Event]) -> Any:
        items = [(p.seq, p.start) for p in sched.prefills]
        items += [(s, s.num_tokens - 1) for s in sched.decodes]
        cow = [e.block_ids for e in events if e.kind == "cow"]
        for p in sched.prefills:
            events.append(Event("prefill", self.kv.step, p.seq.seq_id, _prefill_text(p),
                                tuple(p.seq.block_table)))
        if sched.decodes:
            events.append(Event("decode", self.kv.step, None,
                                f"decode: {len(sched.decodes)} sequence(s) computed one token each",
                                tuple(s.seq_id for s in sched.decodes)))
        if self.runtime is None:
            return DryScores(len(items), self._rng) if items else None
        self.runtime.swap_out(sched.swap_out)
        self.runtime.swap_in(sched.swap_in)
        self.runtime.copy_blocks(cow)
        if not items:
            return None
        batch = [(s.token_ids[n:], n, s.block_table) for s, n in items]
        # async scheduling: a token still on the GPU is read there, from the last step's picks
        feed = [(i, s.inflight_row) for i, (s, _) in enumerate(items) if s.inflight_step >= 0] \
            if self.config.async_scheduling else None
        if feed:
            return self.runtime.execute(batch, feed=(feed, self._last_picks.tokens))
        return self.runtime.execute(batch)

    # ---- postprocess ---------------------------------------------------------------------------

    def _pick(self, sched: ScheduledStep, scores: Any) -> Launched | None:
        """Every token of the step in one batched draw, every beam's candidates in one top-k:
        the device is read once for each, not once per sequence. Under async scheduling a step
        whose picks decide nothing but tokens leaves them on the device (read when it lands)."""
        if scores is None:
            return None
        rows: dict[int, list[tuple[Sequence, int]]] = {}
        fresh: set[int] = set()
        row = 0
        for p in sched.prefills:
            if p.final and not p.resumed:  # an earlier chunk's logits are not sampled
                rows.setdefault(p.group.request_id, []).append((p.seq, row))
                fresh.add(p.group.request_id)
            row += 1
        for seq in sched.decodes:
            rows.setdefault(seq.request_id, []).append((seq, row))
            row += 1
        groups = self.groups
        pending: list[tuple[int, SamplingParams, tuple[int, int, int] | None]] = []
        counts: list[tuple[int, int]] = []  # (draws, top-k rows) per request, in rows' order
        beam_rows: list[int] = []
        beam_ks: list[int] = []
        structural = False  # do the picks fork or free sequences?
        for rid, seq_rows in rows.items():
            group = groups[rid]
            if group.params.beam_width > 1:
                beam_rows += [r for _, r in seq_rows]
                beam_ks += [2 * group.params.beam_width] * len(seq_rows)
                counts.append((0, len(seq_rows)))
                structural = True
            else:
                mine = self._draws(group, seq_rows, rid in fresh)
                pending += mine
                counts.append((len(mine), 0))
                structural |= rid in fresh and group.params.n > 1
        counters = [c for _, _, c in pending if c is not None]
        us = iter(sample_uniforms(counters).tolist() if counters else ())
        draws = [SampleRequest(r, p, 0.0 if c is None else next(us)) for r, p, c in pending]
        launched = Launched(self.kv.step, rows, fresh, counts)
        launched.overlap = (self.config.async_scheduling and not structural
                            and all(d.params.top_p >= 1.0 for d in draws)
                            and hasattr(scores, "pick_rows"))
        if launched.overlap:
            launched.picks = self._last_picks = scores.pick_rows(draws)
            for seq_rows in rows.values():
                for seq, r in seq_rows:
                    seq.inflight_step, seq.inflight_row = launched.step, r
        else:
            launched.tokens = scores.sample_many(draws) if draws else []
            launched.tops = scores.top_many(beam_rows, beam_ks) if beam_rows else []
        return launched

    def _land(self, launched: Launched, events: list[Event]) -> list[RequestOutput]:
        """Postprocess one step: its tokens into their sequences; beams continue by fork and
        free; finished requests end. A sequence or request that ended after the step was
        launched (async scheduling) lets its row go."""
        if launched.picks is not None:
            launched.tokens = launched.picks.result()
        tokens = iter(launched.tokens)
        tops = iter(launched.tops)
        groups = self.groups
        finished = []
        for (rid, seq_rows), count in zip(launched.rows.items(), launched.counts, strict=True):
            group = groups.get(rid)
            if group is None:  # ended while this step ran (async scheduling): skip its picks
                for _ in range(count[0]):
                    next(tokens)
                for _ in range(count[1]):
                    next(tops)
                continue
            if rid in launched.fresh:
                group.prefilled = True
            if group.params.beam_width > 1:
                done = self._beam_step(group, seq_rows, [next(tops) for _ in seq_rows], events)
            else:
                done = self._sample_step(group, seq_rows, tokens, events, rid in launched.fresh,
                                         launched.step)
            if done:
                finished.append(self._finish_group(group, events))
        return finished

    def _draws(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]], fresh: bool
               ) -> list[tuple[int, SamplingParams, tuple[int, int, int] | None]]:
        """What each sequence of a sampling group draws from this step: its row, its params,
        and the counter its uniform number is hashed from, (seed, its index in the group, its
        output position), or None for a greedy row (`_pick` hashes the step's counters at once)."""
        params = group.params
        if params.temperature == 0 and self.runtime is not None:  # greedy: no uniform to draw
            rows = [r for _, r in seq_rows] * (params.n if fresh else 1)  # n copies: forked after
            return [(r, params, None) for r in rows]
        if group.seed is None:
            seed = params.seed
            if seed is None:  # reproducible on replay all the same
                seed = random.Random(self.config.seed * 1_000_003 + group.request_id).getrandbits(62)
            group.seed = request_key(seed)
        key = group.seed
        if fresh and params.n > 1:  # the n samples of the prefill's row, forked after the draw
            row = seq_rows[0][1]
            return [(row, params, (key, i, 0)) for i in range(params.n)]
        # the output position: under async scheduling a token may still be on its way
        if params.n == 1:
            return [(r, params, (key, 0, len(s.output_ids) + (s.inflight_step >= 0)))
                    for s, r in seq_rows]
        index = {s.seq_id: i for i, s in enumerate(group.seqs)}
        return [(r, params, (key, index[s.seq_id], len(s.output_ids) + (s.inflight_step >= 0)))
                for s, r in seq_rows]

    def _sample_step(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]],
                     tokens: Iterator[tuple[int, float]], events: list[Event], fresh: bool,
                     step: int) -> bool:
        params = group.params
        if fresh and params.n > 1:  # parallel sampling: fork the prefilled sequence n - 1 times
            seq, row = seq_rows[0]
            for _ in range(params.n - 1):
                child = self._fork_seq(seq, events)
                group.seqs.append(child)
                seq_rows.append((child, row))
        for seq, _ in seq_rows:
            token, logprob = next(tokens)
            if seq.inflight_step == step:
                seq.inflight_step = seq.inflight_row = -1
            if seq.status is SequenceStatus.FINISHED:
                continue  # ended (eos, stop) while this step ran: its row was spare work
            if seq.token_ids and seq.token_ids[-1] == IN_FLIGHT:  # the next step wrote it blind
                self.kv.land(seq, token, events)
            self._take_token(seq, token, logprob)
            reason = self._finish_reason(seq, params)
            if reason:
                self._end_seq(group, seq, reason, events)
        seqs = group.seqs  # one sequence: no list built to ask whether it is done
        return seqs[0].status is SequenceStatus.FINISHED if len(seqs) == 1 else not group.live()

    def _beam_step(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]],
                   tops: list[list[tuple[int, float]]], events: list[Event]) -> bool:
        params, k = group.params, group.params.beam_width
        beams = [s for s, _ in seq_rows]
        cur_len = len(beams[0].output_ids) + 1  # the length the candidates would have
        final = cur_len >= params.max_tokens
        eos = set(self.eos_token_ids) if not params.ignore_eos else set()
        choice = choose([s.cumulative_logprob for s in beams],
                        tops, k,
                        lambda t: final or t in eos)
        for c in choice.finished:
            parent = beams[c.beam]
            group.finished_beams.append(Hypothesis(
                parent.output_ids + [c.token], c.score,
                length_penalised(c.score, cur_len, params.length_penalty),
                "length" if final else "eos"))
        group.finished_beams.sort(key=lambda h: -h.score)
        del group.finished_beams[k:]
        # the paper's operations: one child continues its parent, more are forks, none is a free
        children: dict[int, list] = {}
        for c in choice.continuing:
            children.setdefault(c.beam, []).append(c)
        for i, parent in enumerate(beams):
            for c in children.get(i, [])[1:]:
                child = self._fork_seq(parent, events)
                group.seqs.append(child)
                child.output_ids = parent.output_ids + [c.token]
                child.pending_token, child.cumulative_logprob = c.token, c.score
        for i, parent in enumerate(beams):
            if i in children:
                c = children[i][0]
                parent.output_ids.append(c.token)
                parent.pending_token, parent.cumulative_logprob = c.token, c.score
            else:
                self._end_seq(group, parent, "pruned", events)
        running = group.live()
        best = max((s.cumulative_logprob for s in running), default=None)
        if final or best is None or should_stop(group.finished_beams, best, cur_len, k,
                                                params.length_penalty):
            for seq in running:
                self._end_seq(group, seq, "length", events)
            return True
        return False

    def _take_token(self, seq: Sequence, token: int, logprob: float) -> None:
        seq.output_ids.append(token)
        seq.pending_token = token
        seq.cumulative_logprob += logprob

    def _finish_reason(self, seq: Sequence, params: SamplingParams) -> str | None:
        if not params.ignore_eos and seq.output_ids[-1] in self.eos_token_ids:
            return "eos"
        if params.stop:
            text = self.decode(seq.output_ids)
            if any(s in text for s in params.stop):
                return "stop"
        if len(seq.output_ids) >= params.max_tokens:
            return "length"
        return None

    def _fork_seq(self, parent: Sequence, events: list[Event]) -> Sequence:
        child = Sequence(self._next_seq_id, request_id=parent.request_id)
        self._next_seq_id += 1
        events += self.kv.fork(parent, child)
        child.output_ids = list(parent.output_ids)
        self.seqs[child.seq_id] = child
        return child

    def _end_seq(self, group: SequenceGroup, seq: Sequence, reason: str, events: list[Event]) -> None:
        events += self.kv.free(seq)
        seq.finish_reason = reason
        seq.status = SequenceStatus.FINISHED
        self.seqs.pop(seq.seq_id, None)
        self.freed[seq.seq_id] = self.kv.step
        if reason != "pruned":
            group.finished_seqs.append(seq)

    def _finish_group(self, group: SequenceGroup, events: list[Event], aborted: bool = False
                      ) -> RequestOutput:
        if group in self.scheduler.running:
            self.scheduler.finish(group)
        for seq in group.seqs:
            self.seqs.pop(seq.seq_id, None)
        out = self._request_output(group, finished=True)
        events.append(Event("finish", self.kv.step, group.seqs[0].seq_id,
                            f"request {group.request_id} finished"
                            f" ({out.outputs[0].finish_reason if out.outputs else 'abort'})"))
        del self.groups[group.request_id]
        return out

    def _detokenizer(self, stop: tuple[str, ...]) -> Any:
        decode = self.tokenizer.decode  # not self.decode: last_step must not hold the engine

        def detokenize(ids: tuple[int, ...]) -> str:
            text = decode(list(ids))
            for s in stop:
                if s in text:
                    text = text[: text.index(s)]
            return text

        return detokenize

    def _lazy_outputs(self) -> LazyOutputs:
        """The running requests' outputs as of now, built only if read. A sequence's
        output_ids only ever grow (a beam child gets a new list), so its length now is enough
        to rebuild this step's view later; the rest is copied now."""
        captured = [(g, [(s, len(s.output_ids), s.cumulative_logprob, s.finish_reason)
                         for s in g.live()], g.num_preemptions) for g in self.scheduler.running]
        detokenizer = self._detokenizer

        def build() -> list[RequestOutput]:
            outs = []
            for group, seqs, preemptions in captured:
                detokenize = detokenizer(group.params.stop)
                outs.append(RequestOutput(
                    group.request_id, group.prompt, tuple(group.prompt_ids),
                    tuple(CompletionOutput(i, tuple(s.output_ids[:n]), lp, reason, detokenize)
                          for i, (s, n, lp, reason) in enumerate(seqs)), False, preemptions))
            return outs

        return LazyOutputs(build)

    def _request_output(self, group: SequenceGroup, finished: bool = False) -> RequestOutput:
        if group.params.beam_width > 1 and finished:
            hyps = group.finished_beams
            items = [(h.token_ids, h.cumulative_logprob, h.finish_reason) for h in hyps]
        else:
            seqs = group.seqs if finished else group.live()
            items = [(s.output_ids, s.cumulative_logprob, s.finish_reason) for s in seqs]
        detokenize = self._detokenizer(group.params.stop)
        outs = tuple(CompletionOutput(i, tuple(ids), lp, reason, detokenize)
                     for i, (ids, lp, reason) in enumerate(items))
        return RequestOutput(group.request_id, group.prompt, tuple(group.prompt_ids), outs,
                             finished, group.num_preemptions)


def _prefill_text(p: PrefillItem) -> str:
    """The narration of one prefill: whole, or which chunk of a chunked prompt."""
    seq = p.seq
    what = "recompute after preemption" if p.resumed else "prefill"
    if p.final and p.start == seq.num_cached_tokens:
        return (f"seq {seq.seq_id}: {what} of {seq.num_tokens} tokens, {p.num_new_tokens} computed, "
                f"{seq.num_cached_tokens} from the prefix cache")
    total = seq.num_tokens + len(seq.prefill_rest)
    rest = "the last chunk" if p.final else f"{len(seq.prefill_rest)} to go"
    cached = f" ({seq.num_cached_tokens} from the prefix cache)" if seq.num_cached_tokens else ""
    return (f"seq {seq.seq_id}: chunked {what}: tokens {p.start}–{seq.num_tokens - 1} of {total} "
            f"computed{cached}, {rest}")

