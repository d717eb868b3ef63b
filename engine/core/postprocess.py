"""Postprocess of a serving step: the picked tokens into their sequences, beams continued by fork
and free, finished requests ended, and the RequestOutputs a step returns.

nano-vllm's `postprocess`: the third part of a step (schedule -> run -> postprocess). It works on
the bookkeeping only (sequences, block tables, requests), so it imports neither torch nor numpy;
the tokens arrive already picked (`Launched`, engine/core/in_flight.py). Beam selection itself
is engine/core/beam_search.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from engine.core.beam_search import Hypothesis, choose, length_penalised, should_stop
from engine.core.events import Event, Finished
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.launched import Launched
from engine.core.outputs import CompletionOutput, LazyOutputs, RequestOutput
from engine.core.registry import Registry
from engine.core.scheduler import Scheduler
from engine.core.sequence import IN_FLIGHT, SamplingParams, Sequence, SequenceGroup, SequenceStatus
from engine.core.speculation import accepted_prefix

Decode = Callable[[list[int]], str]


class Postprocessor:
    """Lands steps' picks. Holds the bookkeeping it changes (never the engine, nor the model)."""

    STATE = ()  # none of its own (engine/core/state.py): the parts it was given hold it
    FIXED = ("kv", "scheduler", "registry", "eos_token_ids", "decode")

    def __init__(self, kv: KVCacheManager, scheduler: Scheduler, registry: Registry,
                 eos_token_ids: tuple[int, ...], decode: Decode) -> None:
        self.kv = kv
        self.scheduler = scheduler
        self.registry = registry
        self.eos_token_ids = eos_token_ids
        self.decode = decode  # the tokenizer's: stop strings are matched on text

    def land(self, launched: Launched, events: list[Event]) -> list[RequestOutput]:
        """Postprocess one step: its tokens into their sequences; beams continue by fork and
        free; finished requests end. A sequence or request that ended after the step was
        launched (async scheduling) lets its row go."""
        if launched.picks is not None:
            launched.tokens = launched.picks.result()
        tokens = iter(launched.tokens)
        tops = iter(launched.tops)
        groups = self.registry.groups
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
                                         launched)
            if done:
                finished.append(self.finish_group(group, events))
        return finished

    def _sample_step(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]],
                     tokens: Iterator[tuple[int, float]], events: list[Event], fresh: bool,
                     launched: Launched) -> bool:
        params, step, drafts = group.params, launched.step, launched.drafts
        if fresh and params.n > 1:  # parallel sampling: fork the prefilled sequence n - 1 times
            seq, row = seq_rows[0]
            for _ in range(params.n - 1):
                child = self._fork_seq(seq, events)
                group.seqs.append(child)
                seq_rows.append((child, row))
        # most requests end only by length: no call a sequence to ask (runs for every
        # sequence of every step)
        by_length = params.ignore_eos and not params.stop
        for seq, _ in seq_rows:
            if drafts and seq.seq_id in drafts:  # k + 1 picks: verify the draft
                self._verify(group, seq, [next(tokens) for _ in range(1 + drafts[seq.seq_id])],
                             events, launched.accepted.get(seq.seq_id))
                continue
            token, logprob = next(tokens)
            if seq.inflight_step == step:
                seq.inflight_step = seq.inflight_row = -1
            if seq.status is SequenceStatus.FINISHED:
                continue  # ended (eos, stop) while this step ran: its row was spare work
            if seq.token_ids and seq.token_ids[-1] == IN_FLIGHT:  # the next step wrote it blind
                self.kv.land(seq, token, events)
            out = seq.output_ids
            out.append(token)
            seq.pending_token = token
            seq.cumulative_logprob += logprob
            if by_length:
                reason = "length" if len(out) >= params.max_tokens else None
            else:
                reason = self._finish_reason(seq, params)
            if reason:
                self._end_seq(group, seq, reason, events)
        seqs = group.seqs  # one sequence: no list built to ask whether it is done
        return seqs[0].status is SequenceStatus.FINISHED if len(seqs) == 1 else not group.live()

    def _verify(self, group: SequenceGroup, seq: Sequence, picks: list[tuple[int, float]],
                events: list[Event], on_device: int | None = None) -> None:
        """Speculative decoding (engine/core/speculation.py): the draft tokens the picks confirm,
        then the first pick that differs (or the bonus pick after them all), each token checked
        for an end as without drafts. The last token taken waits as pending, in no slot; the
        slots of every draft token after the kept ones are rolled back."""
        draft = seq.token_ids[-seq.num_draft:]
        # the device's decision (greedy rows of the decode graphs), or the picks compared here
        accepted = on_device if on_device is not None else accepted_prefix(draft, [t for t, _ in picks])
        if on_device is not None and self.kv.content is not None:  # tests: the two must agree
            if on_device != accepted_prefix(draft, [t for t, _ in picks]):
                raise AssertionError(f"seq {seq.seq_id}: the device kept {on_device} draft tokens, "
                                     f"the picks confirm {accepted_prefix(draft, [t for t, _ in picks])}")
        reason = None
        taken = 0
        for token, logprob in picks[:accepted + 1]:
            seq.output_ids.append(token)
            seq.cumulative_logprob += logprob
            taken += 1
            reason = self._finish_reason(seq, group.params)
            if reason:
                break
        kept = min(accepted, taken)  # drafts that became output
        group.accepted_tokens += kept
        self.scheduler.drafting.verified(seq, len(draft), kept, self.kv.step)
        self.kv.settle_draft(seq, taken - 1, kept, events)
        seq.pending_token = seq.output_ids[-1]
        if reason:
            self._end_seq(group, seq, reason, events)

    def _beam_step(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]],
                   tops: list[list[tuple[int, float]]], events: list[Event]) -> bool:
        params, k = group.params, group.params.beam_width
        beams = [s for s, _ in seq_rows]
        cur_len = len(beams[0].output_ids) + 1  # the length the candidates would have
        final = cur_len >= params.max_tokens
        eos = set(self.eos_token_ids) if not params.ignore_eos else set()
        choice = choose([s.cumulative_logprob for s in beams], tops, k,
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

    def _finish_reason(self, seq: Sequence, params: SamplingParams) -> str | None:
        if not params.ignore_eos and seq.output_ids[-1] in self.eos_token_ids:
            return "eos"
        if params.stop:
            text = self.decode(list(seq.output_ids))
            if any(s in text for s in params.stop):
                return "stop"
        if len(seq.output_ids) >= params.max_tokens:
            return "length"
        return None

    def _fork_seq(self, parent: Sequence, events: list[Event]) -> Sequence:
        child = self.registry.new_seq(request_id=parent.request_id)
        events += self.kv.fork(parent, child)
        child.output_ids = list(parent.output_ids)
        return child

    def _end_seq(self, group: SequenceGroup, seq: Sequence, reason: str, events: list[Event]) -> None:
        events += self.kv.free(seq)
        seq.finish_reason = reason
        self.registry.end(seq, self.kv.step)
        if reason != "pruned":
            group.finished_seqs.append(seq)

    def finish_group(self, group: SequenceGroup, events: list[Event], aborted: bool = False
                     ) -> RequestOutput:
        """The request is over (done, or `aborted` by the scheduler): its final output."""
        if group in self.scheduler.running:
            self.scheduler.finish(group)
        for seq in group.seqs:
            self.registry.seqs.pop(seq.seq_id, None)
        out = request_output(group, self.decode, finished=True)
        events.append(Event("finish", self.kv.step, group.seqs[0].seq_id, facts=Finished(
            group.request_id, out.outputs[0].finish_reason if out.outputs else "abort")))
        del self.registry.groups[group.request_id]
        return out

    def lazy_outputs(self) -> LazyOutputs:
        """The running requests' outputs as of now, built only if read. A sequence's
        output_ids only ever grow (a beam child gets a new list), so its length now is enough
        to rebuild this step's view later; the rest is copied now. Holds the tokenizer's decode
        only: a step's result must not keep the bookkeeping (or an engine) alive."""
        finished = SequenceStatus.FINISHED  # g.live(), without a call a request a step
        captured = [(g, [(s, len(s.output_ids), s.cumulative_logprob, s.finish_reason)
                         for s in g.seqs if s.status is not finished],
                     (g.num_preemptions, g.draft_tokens, g.accepted_tokens, g.num_cached_tokens))
                    for g in self.scheduler.running]
        decode = self.decode

        def build() -> list[RequestOutput]:
            outs = []
            for group, seqs, counts in captured:
                detokenize = detokenizer(decode, group.params.stop)
                outs.append(RequestOutput(
                    group.request_id, group.prompt, tuple(group.prompt_ids),
                    tuple(CompletionOutput(i, tuple(s.output_ids[:n]), lp, reason, detokenize)
                          for i, (s, n, lp, reason) in enumerate(seqs)), False, *counts))
            return outs

        return LazyOutputs(build)


def request_output(group: SequenceGroup, decode: Decode, finished: bool = False) -> RequestOutput:
    """A request's output now: its beams' hypotheses (best first) or its samples."""
    if group.params.beam_width > 1 and finished:
        hyps = group.finished_beams
        items = [(h.token_ids, h.cumulative_logprob, h.finish_reason) for h in hyps]
    else:
        seqs = group.seqs if finished else group.live()
        items = [(s.output_ids, s.cumulative_logprob, s.finish_reason) for s in seqs]
    detokenize = detokenizer(decode, group.params.stop)
    outs = tuple(CompletionOutput(i, tuple(ids), lp, reason, detokenize)
                 for i, (ids, lp, reason) in enumerate(items))
    return RequestOutput(group.request_id, group.prompt, tuple(group.prompt_ids), outs,
                         finished, group.num_preemptions, group.draft_tokens, group.accepted_tokens,
                         group.num_cached_tokens)


def detokenizer(decode: Decode, stop: tuple[str, ...]) -> Callable[[tuple[int, ...]], str]:
    """An output's text from its ids, cut before the first stop string."""

    def detokenize(ids: tuple[int, ...]) -> str:
        text = decode(list(ids))
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    return detokenize
