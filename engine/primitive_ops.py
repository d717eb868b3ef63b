"""The paper's own operations applied straight to sequences: add_sequence, append, fork, free.

The lessons' half of the engine's dispatch (serving is `add_request` and `step`, in
`llm_engine.py`): `Primitives` is a part of LLMEngine that holds the engine's parts these need
(never the engine itself: no reference cycle keeps a dropped engine's KV pool alive). Each
handler takes its op from `engine/ops.py` and returns its result and the events it caused. In
real mode each write is computed by the model right away, one sequence at a time; in dry mode
`append(seq, n)` draws its tokens from the dry runtime's seeded RNG (`primitive_token`).
"""

from __future__ import annotations

from engine import ops, step_run
from engine.core.events import Computed, Event, PrimitivePrefill
from engine.core.in_flight import InFlight
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_content import KVContent
from engine.core.postprocess import Postprocessor
from engine.core.registry import Registry
from engine.core.sequence import Sequence, SequenceGroup
from engine.requests import prompt_tokens, token_list
from engine.runtime.protocols import ModelRuntime


class Primitives:
    """add_sequence, append, fork and free, on the engine's bookkeeping and runtime."""

    STATE = ()  # none of its own (engine/core/state.py): the parts it was given hold it
    FIXED = ("kv", "registry", "runtime", "content", "groups", "tokenizer", "_flight", "_post")

    def __init__(self, kv: KVCacheManager, registry: Registry, runtime: ModelRuntime,
                 content: KVContent | None, flight: InFlight, post: Postprocessor) -> None:
        self.kv, self.registry, self.runtime, self.content = kv, registry, runtime, content
        self.groups: dict[int, SequenceGroup] = registry.groups
        self.tokenizer = runtime.tokenizer
        self._flight, self._post = flight, post

    def add_sequence(self, op: ops.AddSequence) -> tuple[int, list[Event]]:
        tokens = prompt_tokens(op.prompt, self.tokenizer, self.runtime.vocab_size,
                               self.runtime.max_model_len)
        seq = Sequence(self.registry.next_seq_id)
        events = self.kv.allocate(seq, tokens)  # may raise: the sequence is registered after
        seq.prompt_len = len(tokens)
        self.registry.add(seq)
        computed = len(tokens) - seq.num_cached_tokens
        events.append(Event("prefill", self.kv.step, seq.seq_id, tuple(seq.block_table),
                            facts=PrimitivePrefill(len(tokens), computed, seq.num_cached_tokens),
                            form="prefill_primitive"))
        self._compute(seq, seq.num_cached_tokens, events)
        return seq.seq_id, events

    def append(self, op: ops.Append) -> tuple[list[Event], list[Event]]:
        seq = self.registry.live(op.seq)
        if op.token_ids is not None:
            # in this model's vocabulary
            tokens = token_list(op.token_ids, "token_ids", self.runtime.vocab_size)
            events = self.kv.append(seq, tokens)
            # the pending token is dropped; a new one follows these
            self._compute(seq, seq.num_tokens - len(tokens), events)
            return events, events
        # n decode steps, all or nothing: check the whole append fits before drawing, so a refused
        # append leaves the RNG as it was and a replay draws the same tokens
        self.kv.check_append(seq, op.n, decodes=True)
        events: list[Event] = []
        for _ in range(op.n):  # the pending token goes into its slot; the model picks the next
            token = self.runtime.primitive_token(seq.pending_token)
            step_events = self.kv.append(seq, [token])
            self._compute(seq, seq.num_tokens - 1, step_events)
            events += step_events
            if self.kv.sliding:
                events += self.kv.drop_out_of_window(seq)
        return events, events

    def fork(self, op: ops.Fork) -> tuple[int, list[Event]]:
        parent = self.registry.live(op.seq)
        child = self.registry.new_seq()
        events = self.kv.fork(parent, child)
        return child.seq_id, events

    def free(self, op: ops.Free) -> tuple[list[Event], list[Event]]:
        seq = self.registry.live(op.seq)
        events = self.kv.free(seq)
        self.registry.end(seq, self.kv.step)
        group = self.groups.get(seq.request_id) if seq.request_id is not None else None
        if group is not None and not group.live():  # its request has nothing left to run
            for s in group.seqs:
                s.finish_reason = s.finish_reason or "abort"
            self._flight.report_later(self._post.finish_group(group, events, aborted=True))
        return events, events

    def set_prefix_caching(self, op: ops.SetPrefixCaching) -> tuple[None, list[Event]]:
        # read at every allocation and block seal; blocks cached so far keep their hash
        self.kv.enable_prefix_caching = op.enabled
        return None, []

    def _compute(self, seq: Sequence, num_computed: int, events: list[Event]) -> None:
        """Make the copies this write recorded (copy-on-write, the CPU tier's), compute the
        sequence's tokens from num_computed on and keep the greedy next token (the dry mode's
        scores have none: its tokens come from its RNG when they are written)."""
        step_run.move_blocks(self.runtime, self.kv.take_copies(), self.content)
        if self.content is not None:
            self.content.write(seq, num_computed)
        scores = self.runtime.execute([step_run.item(seq, num_computed)])
        pick = scores.greedy(0)
        if pick is None:
            return
        token, logprob = pick
        seq.pending_token = token
        seq.cumulative_logprob += logprob
        n = seq.num_tokens - num_computed
        events.append(Event("decode", self.kv.step, seq.seq_id, (), (token,), facts=Computed(n),
                            form="decode_primitive", names=self.kv.token_repr))
