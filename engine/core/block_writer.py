"""The one place a block is taken from the pool and a sequence's tokens are written into blocks.

Every part of the KV cache manager that moves tokens (its tables, swapping, the CPU tier's loads,
speculative decoding's draft slots: engine/core/kv_cache_manager.py and the components beside it)
goes through a `BlockWriter`: taking a block (evicting the least recently used cached one, whose
K/V go to the CPU tier first), writing tokens into a sequence's tables slot by slot
(copy-on-write first where the last block is shared), hashing a block once it is full, and
stamping each event with the operation's step.

The bookkeeping moves a block's tokens at once; the device moves the bytes later, before the
forward pass. So each copy the bytes must follow (copy-on-write, an offload to the tier, and
the swaps and loads the other components make) is recorded here as data, in the order it was
made (`copies`), and the engine hands that list to the runtime (engine/core/copy_plan.py).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.block_pool import BlockPool, OutOfBlocks
from engine.core.copy_plan import BlockCopy
from engine.core.events import Allocated, Cached, CopiedOnWrite, Event, Offloaded
from engine.core.hashing import HashFn
from engine.core.offload_tier import OffloadTier
from engine.core.sequence import IN_FLIGHT, Sequence
from engine.core.state import fields_state, load_fields

_new = tuple.__new__


class BlockWriter:
    """Takes blocks and writes tokens; records the copies the device must make, in order."""

    STATE = ("step", "enable_prefix_caching", "cow_copies", "evictions", "copies", "stores",
             "dropped")
    FIXED = ("pool", "tier", "block_size", "hash_fn", "token_repr", "store_computed")

    def __init__(self, pool: BlockPool, tier: OffloadTier, hash_fn: HashFn,
                 token_repr: Callable[[int], str], enable_prefix_caching: bool,
                 store_computed: bool = False) -> None:
        self.pool = pool
        self.tier = tier  # the prefix cache's CPU tier: an evicted block's K/V go there
        # a block goes to the tier as soon as it is hashed (tier_store="computed"), not when
        # evicted: its copy waits in `stores` for the pass that computes it
        self.store_computed = store_computed
        self.block_size = pool.block_size
        self.hash_fn = hash_fn
        self.token_repr = token_repr  # narration only: how an event shows a token, when read
        self.enable_prefix_caching = enable_prefix_caching  # read at every seal and allocation
        self.step = 0  # stamped on every event; the engine advances it
        self.cow_copies = 0
        self.evictions = 0
        self.copies: list[BlockCopy] = []  # made since the engine last took them, in order
        # computed blocks to the tier, after the pass (above); none left between operations
        self.stores: list[BlockCopy] = []
        self.dropped: list[tuple[int, int]] = []  # (block, slot) of stores dropped: see above

    def state(self) -> dict:
        """What changes as it writes, as plain data (the pool and tier say theirs)."""
        return fields_state(self)

    def load_state(self, state: dict) -> None:
        load_fields(self, state)

    def require(self, needed: int, available: int, what: str) -> None:
        """Raise OutOfBlocks, changing nothing, when `needed` blocks exceed `available`."""
        if needed > available:
            raise OutOfBlocks(
                f"{what} needs {needed} free block(s) but the pool has only {available} "
                f"(free + cached) of {self.pool.num_blocks}. Free a sequence, or use a larger pool."
            )

    def take_copies(self) -> list[BlockCopy]:
        """The copies recorded since the last call, in the order they were made."""
        copies, self.copies = self.copies, []
        return copies

    def take_stores(self, events: list[Event] | None = None) -> list[BlockCopy]:
        """The stores of computed blocks recorded since the last call (made after the pass).
        `events`: the operation's, from which the events of stores dropped since are taken."""
        stores, self.stores = self.stores, []
        if events is not None and self.dropped:
            dropped, self.dropped = set(self.dropped), []
            events[:] = [e for e in events if e.kind != "offload" or e.facts.evicted
                         or (e.block_ids[0], e.facts.slot) not in dropped]
        return stores

    def allocate(self, sid: int, events: list[Event], narrate: bool, group: int = 0) -> int:
        """A block for seq `sid`'s table in `group`: a free one, else the least recently used
        cached one (evicted, its K/V offloaded to the CPU tier first where there is one)."""
        block_id = self.take_blocks(sid, [group], events)[0]
        if narrate:
            events.append(Event("allocate", self.step, sid, (block_id,)))
        return block_id

    def take_blocks(self, sid: int, groups: list[int], events: list[Event]) -> list[int]:
        """A block for each entry of `groups` (the group it serves), in order, for seq `sid`:
        free ones first, then the least recently used cached ones, each evicted with its K/V
        offloaded to the CPU tier first where there is one. One pass for a whole prompt."""
        ids, evicted = self.pool.allocate_many(sid, groups)
        if evicted:
            tier, step, copies = self.tier, self.step, self.copies
            if self.stores:  # a computed block's store still waiting reads it before its reuse
                self._store_now({block_id for block_id, _, _ in evicted})
            pinned = tier.pinned(step)
            self.evictions += len(evicted)
            slots = tier.store_many([(h, tokens) for _, h, tokens in evicted], pinned)
            if self.stores:  # a slot handed on now lost the entry a waiting store was for
                self._forget_stores(slots)
            # hundreds a step when a long prompt evicts: each record straight from its fields'
            # tuple (a NamedTuple's own __new__ costs a Python call)
            for (block_id, evicted_hash, _), slot in zip(evicted, slots, strict=True):
                events.append(_new(Event, ("evict", step, sid, (block_id,), (), None, (), "", None)))
                if slot is not None:  # its K/V go to the CPU tier before anything overwrites them
                    copies.append(_new(BlockCopy, ("offload", block_id, slot)))
                    facts = _new(Offloaded, (slot, evicted_hash & 0xFFFF, True))
                    events.append(_new(Event, ("offload", step, sid, (block_id,), (), None, facts,
                                               "", None)))
        return ids

    def write(self, seq: Sequence, token_ids: list[int], events: list[Event],
              narrate_each: bool, seal: bool = True) -> None:
        """Write tokens after the sequence's last one in every table: a new block where the
        last is full (or there is none), a copy-on-write where it is shared and partly filled.
        `narrate_each`: an event per token; else one `allocate` event for the new blocks, and
        the tokens go as one operation (a prompt of thousands of tokens costs a few operations
        a block, not a few a token): the same blocks and copies as token by token, its new
        blocks taken (and the cached ones they evict dropped) before they are hashed, as vLLM
        takes a chunk's blocks before it caches them."""
        if narrate_each:
            for token in token_ids:
                self._write_chunk(seq, [token], events, True, seal)
            return
        bs, n = self.block_size, len(token_ids)
        first = -len(seq.token_ids) % bs  # the tokens that fill the last block first
        if first and n:
            self._write_chunk(seq, token_ids[:first], events, False, seal)
        if first >= n:
            return
        tables, sid = seq.block_tables, seq.seq_id
        num_new, num_groups = -(-(n - first) // bs), len(tables)
        ids = self.take_blocks(sid, list(range(num_groups)) * num_new, events)
        start = len(tables[0])
        for g, table in enumerate(tables):
            table += ids[g::num_groups]
        rest = token_ids[first:]
        chunks = [rest[j * bs:(j + 1) * bs] for j in range(num_new)]
        self.pool.fill_blocks(ids, chunks, num_groups)
        seq.token_ids += rest
        if seal and self.enable_prefix_caching:
            full = num_new if len(chunks[-1]) == bs and rest[-1] != IN_FLIGHT else num_new - 1
            self.seal_many(seq, start, [chunks[j] for j in range(full)], events)
        events.append(Event("allocate", self.step, sid, tuple(ids),
                            facts=Allocated(n), form="allocate_many"))

    def _write_chunk(self, seq: Sequence, chunk: list[int], events: list[Event],
                     narrate: bool, seal: bool) -> None:
        """Tokens that fit the sequence's last block, or start a new one when it is full."""
        bs, pool, sid = self.block_size, self.pool, seq.seq_id
        tables = seq.block_tables
        offset = len(seq.token_ids) % bs
        written = []
        for g, table in enumerate(tables):
            if offset == 0:
                block_id = self.allocate(sid, events, narrate, g)
                table.append(block_id)
            else:
                block_id = table[-1]
                if pool.blocks[block_id].ref_count > 1:
                    block_id = self.copy_on_write(seq, g, events)
            pool.extend_tokens(block_id, chunk)
            written.append(block_id)
        seq.token_ids += chunk
        if narrate:
            events.append(self.append_event(sid, chunk[0], tuple(written), offset))
        if offset + len(chunk) == bs and seal and self.enable_prefix_caching \
                and chunk[-1] != IN_FLIGHT:  # an in-flight token's block: when it lands
            self.seal(seq, len(tables[0]) - 1, events)

    def append_decodes(self, seqs: list[Sequence], tokens: list[int], events: list[Event]) -> None:
        """A decode step's appends, a token a sequence, in order: what `write` of each token,
        narrated, does. Where the token goes into room in the unshared last block of each of a
        sequence's tables and does not fill it (most sequences, most steps), inline: its event
        now, the tokens into the pool as one operation at the end (no other append of the step
        reads those blocks: they are nobody else's). A new block, a copy-on-write or a block the
        token fills (then hashed) through `write`."""
        bs, blocks, step, token_repr = self.block_size, self.pool.blocks, self.step, self.token_repr
        into: list[int] = []
        written: list[int] = []
        for seq, token in zip(seqs, tokens, strict=True):
            ids, tables = seq.token_ids, seq.block_tables
            offset = len(ids) % bs
            if 0 < offset < bs - 1:
                if len(tables) == 1:
                    last: tuple[int, ...] = (tables[0][-1],)
                    unshared = blocks[last[0]].ref_count == 1
                else:  # a hybrid: the last block of each group's table
                    last = tuple([t[-1] for t in tables])
                    unshared = all([blocks[b].ref_count == 1 for b in last])
                if unshared:
                    ids.append(token)
                    into += last
                    written += [token] * len(last)
                    events.append(_new(Event, ("append", step, seq.seq_id, last, (token,), offset,
                                               (), "", token_repr)))
                    continue
            self.write(seq, [token], events, narrate_each=True)
        if into:
            self.pool.append_tokens(into, written)

    def append_event(self, sid: int, tok: int, block_ids: tuple[int, ...], offset: int) -> Event:
        # the hot path of a serving step: positional, and no text (the token is named when read)
        return Event("append", self.step, sid, block_ids, (tok,), offset, (), "", self.token_repr)

    def copy_on_write(self, seq: Sequence, group: int, events: list[Event]) -> int:
        """The sequence's shared, partly filled last block in `group` becomes its own copy."""
        table = seq.block_tables[group]
        src = table[-1]
        sid = seq.seq_id
        dst = self.allocate(sid, events, narrate=False, group=group)
        pool = self.pool
        pool.set_tokens(dst, pool.blocks[src].token_ids)
        pool.decref(src, sid)
        table[-1] = dst
        self.cow_copies += 1
        self.copies.append(BlockCopy("copy_blocks", src, dst))
        events.append(Event("cow", self.step, sid, (src, dst),
                            facts=CopiedOnWrite(pool.blocks[src].ref_count + 1)))
        return dst

    def seal(self, seq: Sequence, index: int, events: list[Event]) -> None:
        """Logical block `index` just filled: hash it (the chain's next link) in every group so
        later prompts with this prefix can share it."""
        self.seal_many(seq, index, [self.pool.blocks[seq.block_tables[0][index]].token_ids], events)

    def seal_many(self, seq: Sequence, index: int, chunks: list[list[int]],
                  events: list[Event]) -> None:
        """Logical blocks `index`, `index + 1`, ... just filled with `chunks`: hash each in turn
        (the chain's next links) in every group."""
        hashes, tables, sid, step = seq.block_hashes, seq.block_tables, seq.seq_id, self.step
        parent = hashes[-1] if hashes else None
        register, hash_fn = self.pool.register_hash, self.hash_fn
        stored = []  # (block, hash, tokens) newly cached: to the tier too, if it stores computed
        for j, chunk in enumerate(chunks, index):
            parent = hash_fn(parent, chunk)
            hashes.append(parent)
            for table in tables:  # a block in each group: a hybrid's prompt registers twice
                if register(table[j], parent):  # the records from their fields' tuples, as above
                    events.append(_new(Event, ("cache", step, sid, (table[j],), (), None,
                                               _new(Cached, (parent & 0xFFFF,)), "", None)))
                    stored.append((table[j], parent, chunk))
        if self.store_computed and stored and self.tier.num_blocks:
            self._store_computed(sid, stored, events)

    def _store_computed(self, sid: int, blocks: list[tuple[int, int, list[int]]],
                        events: list[Event]) -> None:
        """Newly hashed blocks (block, hash, tokens) get a tier slot now and their copy after
        the pass that computes them (`stores`); an eviction later finds them in the tier and
        copies nothing. (One KV cache group: the engine refuses the tier for hybrid models.)"""
        step, tier = self.step, self.tier
        slots = tier.store_many([(h, tokens) for _, h, tokens in blocks], tier.pinned(step))
        for (block_id, block_hash, _), slot in zip(blocks, slots, strict=True):
            if slot is not None:
                self.stores.append(_new(BlockCopy, ("offload", block_id, slot)))
                events.append(_new(Event, ("offload", step, sid, (block_id,), (), None,
                                           _new(Offloaded, (slot, block_hash & 0xFFFF, False)),
                                           "", None)))

    def _forget_stores(self, slots: list[int | None]) -> None:
        """Waiting stores into these slots are dropped (their events too: `take_stores`): the
        tier gave each slot to another block, whose copy is made before the pass, and the entry
        the store was for is gone (a tier smaller than what one step computes and evicts)."""
        taken = set(slots)
        dropped = [(c.src, c.dst) for c in self.stores if c.dst in taken]
        if dropped:
            self.dropped += dropped
            self.tier.offloaded_blocks -= len(dropped)  # never copied in
            self.stores = [c for c in self.stores if c.dst not in taken]

    def _store_now(self, blocks: set[int]) -> None:
        """The waiting stores of these blocks move to the copies made before the pass, in
        their order: the blocks are about to be reused, and their bytes are computed already
        (a store waits only for the pass of the step that hashed its block)."""
        now = [c for c in self.stores if c.src in blocks]
        if now:
            self.copies += now
            self.stores = [c for c in self.stores if c.src not in blocks]
