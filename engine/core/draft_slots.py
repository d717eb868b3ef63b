"""Speculative decoding's slots in the block tables: a draft written after a sequence's last
token (not hashed: the model may reject it), then settled after verification (rejected slots
rolled back, a block of rejected tokens only freed, blocks the kept tokens filled hashed).

A component of `KVCacheManager` (engine/core/kv_cache_manager.py), which owns it and calls it: it
writes and hashes through the manager's `BlockWriter` and counts drafted and kept tokens. Every
KV cache group's table takes and gives back its slots together.
"""

from __future__ import annotations

from engine.core.block_writer import BlockWriter
from engine.core.events import Drafted, Event, Rejected
from engine.core.sequence import Sequence
from engine.core.state import fields_state, load_fields


class DraftSlots:
    """The draft-slot operations of the KV cache manager."""

    STATE = ("draft_tokens", "accepted_tokens")
    FIXED = ("writer",)

    def __init__(self, writer: BlockWriter) -> None:
        self.writer = writer
        self.draft_tokens = 0  # slots reserved for drafts, cumulative
        self.accepted_tokens = 0  # drafts verified and kept, cumulative

    def state(self) -> dict:
        return fields_state(self)

    def load_state(self, state: dict) -> None:
        load_fields(self, state)

    def append_draft(self, seq: Sequence, draft: list[int], events: list[Event]) -> None:
        """Write draft tokens after the sequence's last one, in slots of its blocks (new blocks
        as needed; the caller counted them). Not hashed: a block that may hold a token the
        model rejects must never serve a prefix hit. `settle_draft` decides each slot."""
        w = self.writer
        had = {b for t in seq.block_tables for b in t}
        start = seq.num_tokens
        w.write(seq, draft, scratch := [], narrate_each=False, seal=False)
        events += [e for e in scratch if e.kind != "allocate"]  # evictions; the draft names its blocks
        new = tuple(b for t in seq.block_tables for b in t if b not in had)
        events.append(Event("draft", w.step, seq.seq_id, new, tuple(draft), facts=Drafted(start),
                            names=w.token_repr))
        seq.num_draft = len(draft)
        self.draft_tokens += len(draft)

    def settle_draft(self, seq: Sequence, keep: int, accepted: int, events: list[Event]) -> None:
        """After verification: keep the first `keep` draft tokens, give back the slots of the
        rest (a block left holding none of the sequence's tokens returns to the free queue),
        then hash the blocks the kept tokens filled. `accepted`: drafts that became output."""
        w = self.writer
        k, seq.num_draft = seq.num_draft, 0
        self.accepted_tokens += accepted
        bs, end = w.block_size, seq.num_tokens - k + keep
        if keep < k:
            dropped = tuple(seq.token_ids[end:])
            del seq.token_ids[end:]
            freed = []
            for table in seq.block_tables:
                while len(table) > -(-end // bs):
                    freed.append(b := table.pop())
                    w.pool.decref(b, seq.seq_id)
                if end % bs:  # the last block keeps its first slots
                    w.pool.truncate(table[-1], end % bs)
            events.append(Event("reject", w.step, seq.seq_id, tuple(reversed(freed)), dropped,
                                facts=Rejected(accepted, k), names=w.token_repr))
        elif k:
            events.append(Event("draft", w.step, seq.seq_id, (), tuple(seq.token_ids[end - k:]),
                                facts=Drafted(end - k), form="draft_kept",
                                names=w.token_repr))
        if w.enable_prefix_caching:
            for i in range((seq.num_tokens - keep) // bs, end // bs):  # filled by kept drafts
                w.seal(seq, i, events)
