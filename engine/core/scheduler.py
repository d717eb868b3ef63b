"""Continuous batching: which sequences run in the next step, and who is preempted.

Iteration-level scheduling, first come first served, in three passes:

1. **Resume** swapped-out groups (oldest first) when their blocks fit again. Resumed groups go
   before new ones.
2. **Decode** every running sequence one token. Each group reserves the blocks its sequences may
   need (one each: a new block or a copy-on-write). When they do not fit, the latest-arrived
   running group is preempted, all or nothing (the paper's §4.5): by swap (its blocks copied to CPU
   swap space) or by recompute (its blocks freed; it re-prefills later). Swap falls back to
   recompute when the CPU pool is full.
3. **Prefill**: first the next chunk of every running sequence whose prompt is still being
   prefilled, then waiting groups, oldest first (recompute-preempted ones were put back at the
   front), while the step's token and sequence budgets and the free blocks allow. Decodes and
   prefills share one forward pass. With chunked prefill (the default, as in vLLM v1) a
   one-sequence prompt longer than what is left of the token budget is admitted with as many
   tokens as fit, and the rest follows a chunk a step beside the decodes: a long prompt neither
   stalls the running sequences for a whole long step nor waits for them all to finish. Without
   it, such a prompt waits until it fits, and runs whole (over the budget) when nothing else
   runs. No new prompt is admitted in a step that had to preempt: memory is short.

Torch-free: it moves blocks in the bookkeeping and says what to run; the engine runs it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.block_pool import OutOfBlocks
from engine.core.draft_policy import DraftPolicy
from engine.core.events import Aborted, Event, Preempted
from engine.core.group_admission import allocate_together
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.registry import Registry
from engine.core.sequence import IN_FLIGHT, Sequence, SequenceGroup, SequenceStatus


@dataclass
class PrefillItem:
    group: SequenceGroup
    seq: Sequence
    resumed: bool  # recompute after preemption: logits are not sampled, the pending token stays
    start: int = 0  # tokens of seq already in the cache (prefix hits, earlier chunks)
    final: bool = True  # the prompt's last chunk: its logits give the next token

    @property
    def num_new_tokens(self) -> int:
        return self.seq.num_tokens - self.start

    @property
    def recompute(self) -> bool:
        """Computes again what a preemption by recompute dropped (also a first prefill cut
        short by one, which still samples the first token)."""
        return self.resumed or self.group.recomputed


@dataclass
class ScheduledStep:
    prefills: list[PrefillItem] = field(default_factory=list)
    decodes: list[Sequence] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    aborted: list[SequenceGroup] = field(default_factory=list)
    drafts: dict[int, int] = field(default_factory=dict)  # seq id -> draft tokens after its decode
    lookup_due: bool = False  # land this step at once: the next one looks up drafts

    @property
    def num_tokens(self) -> int:
        return (len(self.decodes) + sum(self.drafts.values())
                + sum(p.num_new_tokens for p in self.prefills))


#: blocks a prompt takes from the CPU tier in one step while other requests run (0.5 MB each in
#: a Llama-3.2-1B shape: 16 MB, about a third of a millisecond on the bus)
TIER_LOAD_CHUNK = 32


class Scheduler:
    # declared state (engine/core/state.py): the queues, by request id in a checkpoint
    STATE = ("waiting", "running", "swapped", "num_preemptions", "num_running_seqs")
    FIXED = ("config", "kv", "registry", "drafting")

    def __init__(self, config: EngineConfig, kv: KVCacheManager, registry: Registry,
                 draft_cost: Callable[[int, int], float] | None = None) -> None:
        self.config = config
        self.kv = kv
        self.registry = registry  # the requests its queues order
        # speculative decoding's choices; `draft_cost(B, q)`: a verification step of B sequences
        # of q tokens against a decode step, as the runtime measured it (1 in the dry mode)
        self.drafting = DraftPolicy(config.prompt_lookup_min, config.prompt_lookup_max,
                                    config.num_speculative_tokens,
                                    draft_cost or (lambda num_seqs, q: 1.0))
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # in arrival order
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = 0
        self.num_running_seqs = 0  # live sequences of the running groups, as the decode pass left them

    def state(self) -> tuple:
        """The queues as request ids (the registry's state holds the requests) and the counts."""
        return (tuple(g.request_id for g in self.waiting), tuple(g.request_id for g in self.running),
                tuple(g.request_id for g in self.swapped), self.num_preemptions,
                self.num_running_seqs)

    def load_state(self, state: tuple) -> None:
        """Back to `state`, the queues holding the registry's requests (load the registry's
        state first)."""
        waiting, running, swapped, self.num_preemptions, self.num_running_seqs = state
        groups = self.registry.groups
        self.waiting = deque(groups[r] for r in waiting)
        self.running = [groups[r] for r in running]
        self.swapped = deque(groups[r] for r in swapped)

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def schedule(self) -> ScheduledStep:
        out = ScheduledStep()
        self._resume_swapped(out)
        self._schedule_decodes(out)
        if not out.preempted:
            self._schedule_prefills(out)
        return out

    # ---- passes -------------------------------------------------------------------------------

    def _resume_swapped(self, out: ScheduledStep) -> None:
        while self.swapped:
            group = self.swapped[0]
            seqs = group.live()
            # + one append each, a block in every KV cache group
            need = len(self.kv.distinct_blocks(seqs)) + len(seqs) * self.kv.num_groups
            if need > self.kv.pool.num_blocks:  # it grew past the pool while others ran
                self.swapped.popleft()
                self._abort(group, out)
                continue
            if need > self.kv.pool.num_allocatable:
                return
            self.swapped.popleft()
            events, _ = self.kv.swap_in(seqs)
            out.events += events  # the swap_in event carries the copies
            self._insert_running(group)

    def _schedule_decodes(self, out: ScheduledStep) -> None:
        # Runs for every running sequence every step: one pass, each group's live list taken
        # once, the free-block count read once (only this pass and preemption change it).
        reserved = 0
        allocatable = self.kv.pool.num_allocatable
        needed = self.kv.blocks_needed_to_append
        scheduled: list[tuple[SequenceGroup, list[Sequence]]] = []
        chunked: list[SequenceGroup] = []  # mid-prefill: their next chunk comes after the decodes
        running = self.running
        i = 0
        while i < len(running):
            group = running[i]
            seqs = group.seqs
            # a sequence mid-prefill reserves what one more token of its prompt takes, so that
            # it either progresses or is preempted like any other, never stuck holding blocks
            if len(seqs) == 1:  # most groups: one sequence, live while its group runs
                live = seqs
                need = needed(seqs[0], 1)
            else:
                live = group.live()
                need = needed(live[0], 1) if len(live) == 1 else sum(needed(s, 1) for s in live)
            if need > allocatable - reserved:
                victim = running.pop()  # the latest arrival goes first
                if victim is group and not scheduled:
                    self._abort(victim, out)  # alone and still too big: it can never run
                else:
                    self._preempt(victim, out)
                allocatable = self.kv.pool.num_allocatable  # a swap or a free returned blocks
                continue
            scheduled.append((group, live))
            reserved += need
            i += 1
        self.running = [g for g, _ in scheduled]
        self.num_running_seqs = sum(map(len, (live for _, live in scheduled)))
        decodes = out.decodes
        first = len(decodes)
        tokens: list[int] = []
        for group, live in scheduled:
            if live[0].prefill_rest:
                chunked.append(group)
                continue
            for seq in live:
                if seq.inflight_step < 0:
                    tokens.append(seq.pending_token)
                elif len(seq.output_ids) + 1 < group.params.max_tokens:
                    tokens.append(IN_FLIGHT)  # async scheduling: its token is on the GPU
                else:
                    continue  # the token on its way is its last: nothing more to compute
                decodes.append(seq)
        self.kv.append_decodes(decodes[first:], tokens, out.events)
        if self.config.speculative_method:
            self._draft(out)
        self._continue_prefills(chunked, out)

    def _draft(self, out: ScheduledStep) -> None:
        """Speculative decoding (engine/core/draft_policy.py): decoding sequences whose text
        their n-gram index continues propose drafts; when verifying them pays, each gets slots
        for its draft after its pending token, all or nothing, while the free blocks and the
        step's token budget last; proposals the step does not take back off. Beams do not draft,
        nor does a sequence whose last token is still on the device (async scheduling): its tail
        is not known. Only the sequences the policy has work for are visited: most wait or
        cool down, and a step none of them drafts in should cost what one without drafts does."""
        cfg, policy, step = self.config, self.drafting, self.kv.step
        due = policy.due(out.decodes, step)
        if not due:
            return
        groups = self.registry.groups
        proposals: list[tuple[Sequence, list[int]]] = []
        waiting: list[Sequence] = []  # their last token on the device: no lookup this step
        for seq in due:
            params = groups[seq.request_id].params
            room = params.max_tokens - len(seq.output_ids) - 1  # the last pick: no draft
            if room <= 0 or params.beam_width > 1:
                continue
            if seq.inflight_step >= 0:
                waiting.append(seq)
                continue
            draft = policy.propose(seq, min(cfg.num_speculative_tokens, room), step)
            if draft:
                proposals.append((seq, draft))
        chosen = policy.choose(proposals, len(out.decodes), step)
        if chosen:
            budget = cfg.max_num_batched_tokens - out.num_tokens
            for seq, draft in chosen:
                draft = draft[:budget]
                if not draft or self.kv.blocks_needed_to_append(seq, len(draft)) > \
                        self.kv.pool.num_allocatable:
                    continue
                self.kv.append_draft(seq, draft, out.events)
                out.drafts[seq.seq_id] = len(draft)
                groups[seq.request_id].draft_tokens += len(draft)
                budget -= len(draft)
        out.lookup_due = not out.drafts and policy.wants_lookup(waiting, step, len(out.decodes))

    def _continue_prefills(self, groups: list[SequenceGroup], out: ScheduledStep) -> None:
        """The next chunk of each prompt being prefilled, oldest first, as the budget allows."""
        for group in groups:
            budget = self.config.max_num_batched_tokens - out.num_tokens
            seq = group.live()[0]
            if seq.loading:  # its last blocks from the CPU tier came in during the last step
                out.events += self.kv.load_more(seq, self._load_chunk(out))
                if seq.loading:
                    continue  # more come in this step: the rest of it from a later step
            n = self.kv.tokens_that_fit(seq, min(budget, len(seq.prefill_rest)))
            if n <= 0:
                continue  # no budget or no block this step: it waits, holding what it has
            start = seq.num_tokens
            chunk, seq.prefill_rest = seq.prefill_rest[:n], seq.prefill_rest[n:]
            out.events += self.kv.extend(seq, chunk)
            out.prefills.append(PrefillItem(group, seq, group.prefilled, start, not seq.prefill_rest))

    def _schedule_prefills(self, out: ScheduledStep) -> None:
        cfg = self.config
        num_seqs = self.num_running_seqs  # every running group's: decoding, or mid-prefill
        while self.waiting:
            group = self.waiting[0]
            seqs = group.live()
            width = len(seqs) if group.prefilled else group.width
            if num_seqs + width > cfg.max_num_seqs and num_seqs > 0:
                return
            prompts = [s.resume_tokens if group.prefilled else group.prompt_ids for s in seqs]
            budget = cfg.max_num_batched_tokens - out.num_tokens
            step_tokens = out.num_tokens + sum(map(len, prompts))  # an upper bound: hits compute less
            # one sequence to prefill: it may go in chunks (a resumed group of several goes whole)
            chunk = cfg.enable_chunked_prefill and len(seqs) == 1 and step_tokens > cfg.max_num_batched_tokens
            if chunk and budget <= 0:
                return
            if not chunk and step_tokens > cfg.max_num_batched_tokens and (out.decodes or out.prefills):
                return
            whole_pool_free = self.kv.pool.num_allocatable == self.kv.pool.num_blocks
            try:
                if len(seqs) == 1:  # may go in chunks; beside others, waits for the CPU tier
                    most = self._load_chunk(out)
                    events = self.kv.allocate(seqs[0], prompts[0], budget if chunk else None,
                                              defer_loads=most is not None, max_loads=most)
                else:  # a resumed group of several, all or nothing
                    events = allocate_together(self.kv, seqs, prompts)
            except OutOfBlocks:
                if not whole_pool_free:
                    return  # wait for blocks to come free
                self.waiting.popleft()  # even an empty pool cannot hold it
                self._abort(group, out)
                continue
            for seq, tokens in zip(seqs, prompts, strict=True):
                seq.prefill_rest = tokens[seq.num_tokens:]
            self.waiting.popleft()
            out.events += events
            if not group.prefilled:  # as vLLM: the hits of its first admission
                group.num_cached_tokens = seqs[0].num_cached_tokens
            for seq in seqs:
                if not group.prefilled:
                    seq.prompt_len = len(group.prompt_ids)
                seq.resume_tokens = []
                seq.status = SequenceStatus.RUNNING
                if seq.loading:  # its tier blocks come in this step: the rest of it next step
                    continue
                out.prefills.append(PrefillItem(group, seq, group.prefilled, seq.num_cached_tokens,
                                                not seq.prefill_rest))
            self._insert_running(group)
            num_seqs += width
            self.num_running_seqs = num_seqs

    def _load_chunk(self, out: ScheduledStep) -> int | None:
        """How many blocks a prompt may take from the CPU tier in this step: TIER_LOAD_CHUNK
        beside other requests' work, so that the load's bookkeeping (an allocation, an eviction
        to the tier and a copy a block) and its copies spread over steps instead of stalling one
        of theirs (its copies overlap their steps), and the prompt computes nothing until the
        step after its last blocks came (their forward pass never waits for the bus). None (all
        of them) when nothing else runs: then nobody's pass can wait for it, and the rest of the
        prompt is computed in the same step, its pass waiting on the device for the copy."""
        busy = out.decodes or out.prefills or self.num_running_seqs > 1
        return TIER_LOAD_CHUNK if busy else None

    # ---- preemption ---------------------------------------------------------------------------

    def _preempt(self, group: SequenceGroup, out: ScheduledStep) -> None:
        seqs = group.live()
        group.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(group)
        cpu_free = self.kv.cpu_pool.num_allocatable
        if self.config.preemption_mode == "swap" and len(self.kv.distinct_blocks(seqs)) <= cpu_free:
            events, pairs = self.kv.swap_out(seqs)
            self.swapped.append(group)
            swapped: int | None = len(pairs)
        else:
            events = []
            for seq in seqs:
                seq.resume_tokens = seq.token_ids + seq.prefill_rest  # a chunked prompt: all of it
                events += self.kv.free(seq)
                seq.token_ids, seq.prefill_rest = [], []
                seq.num_cached_tokens = 0
                seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(group)
            group.recomputed = True
            swapped = None  # recomputed; a fallback where swap was asked for and CPU space is full
        fallback = swapped is None and self.config.preemption_mode == "swap"
        out.events.append(Event("preempt", self.kv.step, seqs[0].seq_id, facts=Preempted(
            group.request_id, tuple(s.seq_id for s in seqs), swapped, fallback)))
        out.events += events

    def _abort(self, group: SequenceGroup, out: ScheduledStep) -> None:
        """A group that cannot continue even with the whole pool to itself ends now."""
        for seq in group.live():
            out.events += self.kv.free(seq)
            seq.finish_reason = "abort"
            seq.status = SequenceStatus.FINISHED
        out.aborted.append(group)
        out.events.append(Event("finish", self.kv.step, group.seqs[0].seq_id,
                                facts=Aborted(group.request_id, self.kv.pool.num_blocks),
                                form="abort"))

    def _insert_running(self, group: SequenceGroup) -> None:
        i = len(self.running)
        while i > 0 and self.running[i - 1].arrival > group.arrival:
            i -= 1
        self.running.insert(i, group)

    def finish(self, group: SequenceGroup) -> None:
        self.running.remove(group)
