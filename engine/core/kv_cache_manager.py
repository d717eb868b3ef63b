"""Block tables: allocate with prefix lookup, append (with copy-on-write), fork, free, drop.

The paper's §5.2 in code. Every operation is all-or-nothing: it first counts the blocks it needs
and raises `OutOfBlocks` before touching anything when the pool cannot give them. Each returns the
events it caused; a "cow" event's block_ids are (source, copy), which the runtime turns into a
real copy of K/V bytes before the model writes.

A hybrid model has several KV cache groups (engine/core/kv_groups.py): a sequence then has a
table per group, every table as long as the others, and each new logical block takes a block in
every group. A sliding-window group's table drops the blocks its window has passed
(`drop_out_of_window`, after every operation), so its entries start with None.

The manager owns its parts and calls them, each with its dependencies given explicitly: a
`BlockWriter` (engine/core/block_writer.py: taking blocks, writing tokens, copy-on-write, hashing,
and the copies the device must follow, recorded in order), `Swapping`, `TierLoads` and
`DraftSlots`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from engine.core.block_pool import BlockPool
from engine.core.block_writer import BlockWriter
from engine.core.copy_plan import BlockCopy
from engine.core.draft_slots import DraftSlots
from engine.core.events import Dropped, Event, Forked, Freed, PrefixHit
from engine.core.hashing import HashFn, hash_block
from engine.core.invariants import InvariantError, check_pool
from engine.core.kv_content import KVContent
from engine.core.kv_groups import KVCacheGroup, dead_blocks, single_group
from engine.core.offload_tier import OffloadTier
from engine.core.prefix_match import match_prefix
from engine.core.sequence import Sequence, SequenceStatus
from engine.core.state import fields_state, load_fields
from engine.core.swapping import Swapping, distinct_blocks
from engine.core.tier_loads import TierLoads

__all__ = ["InvariantError", "KVCacheManager", "ManagerState"]


class ManagerState(NamedTuple):
    """A KV cache manager's state as plain data (`KVCacheManager.state`): its own counters and
    each part's state, by the part's name."""

    counters: dict[str, int]
    parts: dict[str, Any]


class KVCacheManager:
    # declared state (engine/core/state.py); `state()` adds the states of the parts it owns
    STATE = ("prefix_hit_blocks", "dropped_blocks")
    PARTS = ("pool", "cpu_pool", "tier", "writer", "drafts")
    FIXED = PARTS + ("swapping", "tier_loads", "block_size", "groups", "num_groups", "sliding",
                     "hash_fn", "content")  # content: the engine's, whose checkpoint says it

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block,
        token_repr: Callable[[int], str] = repr,
        num_cpu_blocks: int = 0,
        num_offload_blocks: int = 0,
        groups: tuple[KVCacheGroup, ...] = single_group(),
        content: KVContent | None = None,
        fetch_ahead: Callable[[list[int]], None] | None = None,
        tier_store: str = "evicted",
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.tier = OffloadTier(num_offload_blocks)  # the prefix cache's CPU tier
        self.cpu_pool = BlockPool(num_cpu_blocks, block_size)  # swap space; never hashed
        self.block_size = block_size
        self.groups = groups
        self.num_groups = len(groups)
        self.sliding = any(g.sliding for g in groups)
        self.hash_fn = hash_fn
        self.writer = BlockWriter(self.pool, self.tier, hash_fn, token_repr, enable_prefix_caching,
                                  store_computed=tier_store == "computed")
        self.swapping = Swapping(self.writer, self.cpu_pool)
        # the runtime's bus copies of a load start as its slots are chosen (tier_loads.py)
        self.tier_loads = TierLoads(self.writer, self.tier, fetch_ahead)
        self.drafts = DraftSlots(self.writer)
        self.prefix_hit_blocks = 0
        self.dropped_blocks = 0  # sliding groups: table entries dropped, cumulative
        self.content = content  # the device's K/V as labels, when tracked

    # ---- what the parts share: the operation's step, the prefix-caching switch --------------

    @property
    def step(self) -> int:
        """The operation being run: stamped on every event (the engine advances it)."""
        return self.writer.step

    @step.setter
    def step(self, step: int) -> None:
        self.writer.step = step

    @property
    def enable_prefix_caching(self) -> bool:
        return self.writer.enable_prefix_caching

    @enable_prefix_caching.setter
    def enable_prefix_caching(self, enabled: bool) -> None:
        self.writer.enable_prefix_caching = enabled  # read at every allocation and block seal

    @property
    def token_repr(self) -> Callable[[int], str]:
        return self.writer.token_repr

    def counters(self) -> dict[str, int]:
        """The cumulative counts a snapshot's metrics report."""
        w, d, t = self.writer, self.drafts, self.tier
        return {"prefix_hit_blocks": self.prefix_hit_blocks, "cow_copies": w.cow_copies,
                "evictions": w.evictions, "draft_tokens": d.draft_tokens,
                "accepted_tokens": d.accepted_tokens, "offloaded_blocks": t.offloaded_blocks,
                "offload_hit_blocks": t.hit_blocks, "dropped_blocks": self.dropped_blocks}

    def state(self) -> ManagerState:
        """Everything the manager and its parts hold, as plain data (its sizes, groups and hash
        function are fixed at construction; the content shadow is the engine's, said apart)."""
        return ManagerState(fields_state(self),
                            {name: getattr(self, name).state() for name in self.PARTS})

    def load_state(self, state: ManagerState) -> None:
        """Back to `state` (from `state()` of a manager of these sizes), in place."""
        for name in self.PARTS:
            getattr(self, name).load_state(state.parts[name])
        load_fields(self, state.counters)

    def take_copies(self) -> list[BlockCopy]:
        """The block copies the device must make, in the order the bookkeeping made them
        since the last call (engine/core/copy_plan.py cuts them into waves)."""
        return self.writer.take_copies()

    def take_stores(self, events: list[Event] | None = None) -> list[BlockCopy]:
        """The tier's stores of computed blocks (`tier_store="computed"`) recorded since the
        last call: made after the forward pass that computes their blocks. `events`, at the
        end of an operation: its events, less those of stores the tier dropped since."""
        return self.writer.take_stores(events)

    # ---- the components' operations -----------------------------------------------------------

    distinct_blocks = staticmethod(distinct_blocks)

    def swap_out(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        return self.swapping.swap_out(seqs)

    def swap_in(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        return self.swapping.swap_in(seqs)

    def append_draft(self, seq: Sequence, draft: list[int], events: list[Event]) -> None:
        self.drafts.append_draft(seq, draft, events)

    def settle_draft(self, seq: Sequence, keep: int, accepted: int, events: list[Event]) -> None:
        self.drafts.settle_draft(seq, keep, accepted, events)

    # ---- capacity -------------------------------------------------------------------------

    def blocks_needed_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks an append of num_new_tokens takes in one pass: the overflow in every
        group, plus one for each copy-on-write of a shared, partly filled last block."""
        bs = self.block_size
        n = len(seq.token_ids)
        tables = seq.block_tables
        needed = -(-(n + num_new_tokens) // bs) - len(tables[0])
        if len(tables) == 1:  # most models, and every running sequence every step: no generator
            if num_new_tokens and n % bs:
                needed += self.pool.blocks[tables[0][-1]].ref_count > 1
            return needed
        needed *= len(tables)
        if num_new_tokens and n % bs:  # a loop, not a generator: a hybrid's every decode step
            blocks = self.pool.blocks
            for t in tables:
                if blocks[t[-1]].ref_count > 1:
                    needed += 1
        return needed

    def blocks_needed_for_decodes(self, seq: Sequence, n: int) -> int:
        """The most blocks n decode steps (one token each, out-of-window blocks dropped after
        each) hold at once beyond what the sequence holds now: all-or-nothing for `append(n)`."""
        if not self.sliding:
            return self.blocks_needed_to_append(seq, n)
        bs, start = self.block_size, seq.num_tokens
        blocks = self.pool.blocks
        tables = seq.block_tables
        cow = [bool(start % bs) and blocks[t[-1]].ref_count > 1 for t in tables]
        held = peak = sum(cow)

        def released(g: int, j: int) -> bool:  # would dropping entry j give a block back?
            table = tables[g]
            if j >= len(table) or (j == len(table) - 1 and cow[g]):
                return True  # a block this append takes
            return table[j] is not None and blocks[table[j]].ref_count == 1

        for p in range(start, start + n):
            if p % bs == 0:
                held += len(tables)
                peak = max(peak, held)
            for g, group in enumerate(self.groups):
                if group.window is not None:
                    before = dead_blocks(p, group.window, bs, -(-p // bs))  # the tables' lengths
                    after = dead_blocks(p + 1, group.window, bs, p // bs + 1)  # then and now
                    held -= sum(released(g, j) for j in range(before, after))
        return peak

    def check_append(self, seq: Sequence, num_new_tokens: int, decodes: bool = False) -> None:
        """Raise OutOfBlocks, changing nothing, when appending that many tokens cannot fit
        (`decodes`: one token a step, so sliding groups drop blocks on the way)."""
        needed = (self.blocks_needed_for_decodes(seq, num_new_tokens) if decodes
                  else self.blocks_needed_to_append(seq, num_new_tokens))
        if needed > self.pool.num_allocatable:  # the message is built only when it is needed
            self.writer.require(needed, self.pool.num_allocatable,
                                f"appending {num_new_tokens} token(s) to seq {seq.seq_id}")

    # ---- the primitives -------------------------------------------------------------------

    def allocate(self, seq: Sequence, prompt: list[int], max_new: int | None = None,
                 defer_loads: bool = False, max_loads: int | None = None) -> list[Event]:
        """Give a sequence a block table (one per group) for `prompt` (its tokens to prefill: a
        new prompt, or prompt + generated tokens when it resumes after preemption), sharing
        cached prefix blocks. `max_new` (chunked prefill): write at most that many tokens after
        the prefix hits; the caller keeps the rest (`prompt[seq.num_tokens:]`) for `extend`s.
        `defer_loads` (serving, beside other requests): when blocks come back from the CPU tier,
        write nothing after them this step (`seq.loading`): the sequence waits a step while their
        bytes come in, so that no other request's forward pass waits for them.
        `max_loads`: take at most that many blocks from the tier now (`load_more` the rest)."""
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        bs, sid = self.block_size, seq.seq_id
        tables, hashes = match_prefix(self, prompt) if self.enable_prefix_caching else (None, [])
        hit = len(hashes)
        loads = self.tier_loads.match(prompt, hashes, max_loads if defer_loads else None)
        served = hit + len(loads)
        end = len(prompt) if max_new is None else min(len(prompt), served * bs + max_new)
        if loads and defer_loads:
            end = served * bs
        hit_ids = [b for t in tables or () for b in t if b is not None]
        cached_hits = sum(1 for b in hit_ids if self.pool.blocks[b].ref_count == 0)
        self.writer.require(
            (-(-end // bs) - hit) * self.num_groups,
            self.pool.num_allocatable - cached_hits,
            f"a prompt of {len(prompt)} tokens" if end == len(prompt)
            else f"the first {end} tokens of a prompt of {len(prompt)}",
        )
        events: list[Event] = []
        seq.block_tables = tables or [[] for _ in self.groups]
        seq.token_ids, seq.block_hashes = prompt[:hit * bs], hashes
        seq.num_cached_tokens = hit * bs
        if hit:
            live = [b for b in hit_ids if self.pool.blocks[b].ref_count > 0]
            for b in hit_ids:
                self.pool.incref(b, sid)
            self.prefix_hit_blocks += len(hit_ids)
            events.append(Event("prefix_hit", self.step, sid, tuple(hit_ids),
                                facts=PrefixHit(hit * bs, len(prompt))))
            if live:
                events.append(Event("share", self.step, sid, tuple(live)))
        if loads:
            self.tier_loads.touch(loads)  # not before `require`: a refused prompt changes nothing
            self.tier_loads.load(seq, prompt, loads, events)
        # set every time: a sequence preempted while its loads came in must not skip its next
        # prefill (its blocks would be hashed with K/V nobody computed)
        seq.loading = bool(loads) and defer_loads
        self.writer.write(seq, prompt[len(seq.token_ids):end], events, narrate_each=False)
        seq.status = SequenceStatus.RUNNING
        return events

    def load_more(self, seq: Sequence, most: int | None) -> list[Event]:
        """A sequence loading its prompt's prefix from the CPU tier in parts: its next blocks
        the tier still holds (at most `most`, and as many as the pool can give now) become its
        blocks, their bytes copied back (`seq.loading` stays set); none left to take ends the
        loading (its rest is computed from now on), and so does `most` None (nothing else
        runs) with all of them taken: its rest is computed in this step, after the copies. Its
        prompt's rest shrinks to match."""
        prompt = seq.token_ids + seq.prefill_rest
        found = self.tier_loads.match(prompt, seq.block_hashes, most)
        self.tier_loads.touch(found)  # every hit, the ones left for a later step too
        loads = found[:self.pool.num_allocatable // self.num_groups]
        events: list[Event] = []
        if loads:
            self.tier_loads.load(seq, prompt, loads, events)
            seq.prefill_rest = prompt[seq.num_tokens:]
        # found but no block free for it now: it waits, as a prompt does
        seq.loading = bool(found) and (most is not None or len(loads) < len(found))
        return events

    def extend(self, seq: Sequence, token_ids: list[int]) -> list[Event]:
        """The next chunk of a chunked prefill: like `append`, narrated as one allocation
        rather than token by token (a chunk can be thousands of tokens)."""
        self.check_append(seq, len(token_ids))
        events: list[Event] = []
        self.writer.write(seq, token_ids, events, narrate_each=False)
        return events

    def tokens_that_fit(self, seq: Sequence, num_tokens: int) -> int:
        """How many of the next num_tokens an `extend` could take now: the slots left in the
        last block plus the allocatable blocks, a block in every group for each new logical
        block (a sequence mid-prefill never shares its last block: no copy-on-write)."""
        slack = -seq.num_tokens % self.block_size
        per_block = self.num_groups
        return min(num_tokens, slack + self.pool.num_allocatable // per_block * self.block_size)

    def append(self, seq: Sequence, token_ids: list[int]) -> list[Event]:
        """Write tokens after the sequence's last token, one slot each (copy-on-write first
        when the last block is shared and partly filled)."""
        self.check_append(seq, len(token_ids))
        events: list[Event] = []
        self.writer.write(seq, token_ids, events, narrate_each=True)
        return events

    def append_decodes(self, seqs: list[Sequence], tokens: list[int], events: list[Event]) -> None:
        """A decode step's appends, a token for each sequence, in order, whose blocks the
        scheduler's decode pass has already counted: no second capacity check in the hot path
        (`BlockWriter.append_decodes`)."""
        self.writer.append_decodes(seqs, tokens, events)

    def land(self, seq: Sequence, token: int, events: list[Event]) -> None:
        """Async scheduling: the sequence's last token was written as IN_FLIGHT; now its id is
        known. Put it in the sequence and its blocks, and hash them if that filled them."""
        ids = seq.token_ids
        ids[-1] = token
        if self.content is not None:
            self.content.land(seq.seq_id, len(ids) - 1, token)
        tables = seq.block_tables
        for table in tables:
            self.pool.set_last_token(table[-1], token)
        if self.writer.enable_prefix_caching and len(ids) % self.block_size == 0:
            self.writer.seal(seq, len(tables[0]) - 1, events)

    def fork(self, parent: Sequence, child: Sequence) -> list[Event]:
        """The child gets a copy of the parent's block tables; nothing is copied but ids."""
        child.token_ids = list(parent.token_ids)
        child.block_tables = [list(t) for t in parent.block_tables]
        child.block_hashes = list(parent.block_hashes)
        child.pending_token = parent.pending_token
        child.prompt_len = parent.prompt_len
        child.num_cached_tokens = parent.num_cached_tokens
        child.cumulative_logprob = parent.cumulative_logprob
        child.parent_id = parent.seq_id
        child.status = parent.status
        shared = [b for t in child.block_tables for b in t if b is not None]
        for b in shared:
            self.pool.incref(b, child.seq_id)
        return [Event("share", self.step, child.seq_id, tuple(shared),
                      facts=Forked(parent.seq_id), form="fork")]

    def free(self, seq: Sequence) -> list[Event]:
        """Let go of every block table. Blocks enter the LRU last logical block first, so the
        start of a prefix, the part most likely to be asked for again, stays cached longest."""
        swapped = seq.status is SequenceStatus.SWAPPED  # its blocks are in CPU swap space
        pool = self.cpu_pool if swapped else self.pool
        tables = seq.block_tables
        order = [b for j in range(len(tables[0]) - 1, -1, -1) for t in tables if (b := t[j]) is not None]
        released = pool.decref_many(order, seq.seq_id)
        gone = set(released)
        kept = [b for b in order if b not in gone]
        released.reverse()
        kept.reverse()
        seq.block_tables = [[] for _ in tables]
        if self.content is not None:
            self.content.forget(seq.seq_id)
        # which released blocks stay cached is a fact of now: the narration is written later
        cached = tuple(b for b in released if pool.blocks[b].block_hash is not None)
        return [Event("free", self.step, seq.seq_id, tuple(released), facts=Freed(cached, tuple(kept)),
                      form="free_swapped" if swapped else "")]

    def drop_out_of_window_all(self, seqs: Iterable[Sequence]) -> list[Event]:
        """`drop_out_of_window` for each of `seqs`, after every operation: most sequences most
        steps have nothing newly out of their windows, and that is found here without a call
        per sequence (a hybrid's decode step runs this for every running sequence)."""
        events: list[Event] = []
        bs = self.block_size
        sliding = [(g, group.window) for g, group in enumerate(self.groups) if group.window]
        for seq in seqs:
            n, tables = seq.num_tokens, seq.block_tables
            for g, window in sliding:  # drop_out_of_window's own test of "nothing new"
                table = tables[g]
                j = dead_blocks(n, window, bs, len(table)) - 1
                if j >= 0 and table[j] is not None:
                    events += self.drop_out_of_window(seq)
                    break
        return events

    def drop_out_of_window(self, seq: Sequence) -> list[Event]:
        """Sliding-window groups: give back the blocks no future query of the sequence can
        see (its entries become None). A shared block only loses this table's reference."""
        events: list[Event] = []
        bs, n = self.block_size, seq.num_tokens
        for g, group in enumerate(self.groups):
            if group.window is None:
                continue
            table = seq.block_tables[g]
            j = dead_blocks(n, group.window, bs, len(table)) - 1
            if j < 0 or table[j] is None:  # most steps: nothing newly out of the window
                continue
            last = j
            while j >= 0 and table[j] is not None:  # the newly dead ones: amortised O(1)
                j -= 1
            dropped = table[j + 1:last + 1][::-1]  # last first: the LRU order of one at a time
            table[j + 1:last + 1] = [None] * len(dropped)
            released = self.pool.decref_many(dropped, seq.seq_id)
            gone = set(released)  # a long prompt drops hundreds at once: no list scans
            self.dropped_blocks += len(dropped)
            blocks = self.pool.blocks
            events.append(Event("drop", self.step, seq.seq_id, tuple(reversed(dropped)),
                                facts=Dropped(group.name, group.window, j + 1,
                                              tuple(b for b in released if blocks[b].block_hash is not None),
                                              tuple(b for b in dropped if b not in gone))))
        return events

    # ---- checks -------------------------------------------------------------------------------

    def check_invariants(self, on_gpu: list[Sequence], on_cpu: list[Sequence] = ()) -> None:
        """Raise InvariantError on any contradiction between pools, tables and the hash map."""
        check_pool(self.pool, on_gpu, self.block_size, "", self.groups)
        check_pool(self.cpu_pool, list(on_cpu), self.block_size, "cpu ", self.groups)
        if problem := self.tier.check():
            raise InvariantError(problem)
        for (g, h), b in self.pool.hash_to_block.items():
            block = self.pool.blocks[b]
            if block.block_hash != h or block.group != g:
                raise InvariantError(f"hash map entry {h:x} of group {g} points at block {b}, "
                                     f"which holds another hash or group")
