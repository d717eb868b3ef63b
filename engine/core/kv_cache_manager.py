"""Block tables: allocate with prefix lookup, append (with copy-on-write), fork, free.

The paper's §5.2 in code. Every operation is all-or-nothing: it first counts the blocks it needs
and raises `OutOfBlocks` before touching anything when the pool cannot give them. Each returns the
events it caused; a "cow" event's block_ids are (source, copy), which the runtime turns into a
real copy of K/V bytes before the model writes.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.block_pool import BlockPool, OutOfBlocks
from engine.core.draft_slots import DraftSlots
from engine.core.events import Event
from engine.core.hashing import HashFn, hash_block
from engine.core.invariants import InvariantError, check_pool
from engine.core.offload_tier import OffloadTier
from engine.core.sequence import IN_FLIGHT, Sequence, SequenceStatus


class KVCacheManager(DraftSlots):
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block,
        token_repr: Callable[[int], str] = repr,
        num_cpu_blocks: int = 0,
        num_offload_blocks: int = 0,
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.tier = OffloadTier(num_offload_blocks)  # the prefix cache's CPU tier
        self._loading: tuple[int, set[int]] = (-1, set())  # (step, tier slots its loads read)
        self.cpu_pool = BlockPool(num_cpu_blocks, block_size)  # swap space; never hashed
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_fn = hash_fn
        self.token_repr = token_repr  # narration only: how an event shows a token, when read
        self.step = 0  # stamped on every event; the engine advances it
        self.prefix_hit_blocks = 0
        self.cow_copies = 0
        self.evictions = 0
        self.draft_tokens = 0  # speculative decoding: slots reserved for drafts, cumulative
        self.accepted_tokens = 0  # drafts verified and kept

    # ---- capacity -------------------------------------------------------------------------

    def blocks_needed_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks an append of num_new_tokens takes: the overflow, plus one for a
        copy-on-write when the partly filled last block is shared."""
        bs = self.block_size
        n = seq.num_tokens
        needed = -(-(n + num_new_tokens) // bs) - len(seq.block_table)
        if num_new_tokens and n % bs and self.pool.blocks[seq.block_table[-1]].ref_count > 1:
            needed += 1
        return needed

    def check_append(self, seq: Sequence, num_new_tokens: int) -> None:
        """Raise OutOfBlocks, changing nothing, when appending that many tokens cannot fit."""
        needed = self.blocks_needed_to_append(seq, num_new_tokens)
        if needed > self.pool.num_allocatable:  # the message is built only when it is needed
            self._require(needed, self.pool.num_allocatable,
                          f"appending {num_new_tokens} token(s) to seq {seq.seq_id}")

    def _require(self, needed: int, available: int, what: str) -> None:
        if needed > available:
            raise OutOfBlocks(
                f"{what} needs {needed} free block(s) but the pool has only {available} "
                f"(free + cached) of {self.pool.num_blocks}. Free a sequence, or use a larger pool."
            )

    # ---- the primitives -------------------------------------------------------------------

    def allocate(self, seq: Sequence, prompt: list[int], max_new: int | None = None) -> list[Event]:
        """Give a sequence a block table for `prompt` (its tokens to prefill: a new prompt, or
        prompt + generated tokens when it resumes after preemption), sharing cached prefix blocks.
        `max_new` (chunked prefill): write at most that many tokens after the prefix hits; the
        caller keeps the rest (`prompt[seq.num_tokens:]`) for later `extend`s."""
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        bs = self.block_size
        hits = self._match_prefix(prompt)
        loads = self._match_tier(prompt, hits)
        served = len(hits) + len(loads)
        end = len(prompt) if max_new is None else min(len(prompt), served * bs + max_new)
        cached_hits = sum(1 for b, _ in hits if self.pool.blocks[b].ref_count == 0)
        self._require(
            -(-end // bs) - len(hits),
            self.pool.num_allocatable - cached_hits,
            f"a prompt of {len(prompt)} tokens" if end == len(prompt)
            else f"the first {end} tokens of a prompt of {len(prompt)}",
        )
        events: list[Event] = []
        sid = seq.seq_id
        seq.token_ids, seq.block_table, seq.block_hashes = [], [], []
        seq.num_cached_tokens = 0
        if hits:
            hit_ids = [b for b, _ in hits]
            live = [b for b in hit_ids if self.pool.blocks[b].ref_count > 0]
            for b in hit_ids:
                self.pool.incref(b, sid)
            n_hit = len(hits) * bs
            seq.block_table = hit_ids
            seq.block_hashes = [h for _, h in hits]
            seq.token_ids = prompt[:n_hit]
            seq.num_cached_tokens = n_hit
            self.prefix_hit_blocks += len(hits)
            events.append(Event("prefix_hit", self.step, sid, tuple(hit_ids),
                                facts=(n_hit, len(prompt))))
            if live:
                events.append(Event("share", self.step, sid, tuple(live)))
        if loads:
            self._load(seq, prompt, loads, events)
        self._write(seq, prompt[len(seq.token_ids):end], events, narrate_each=False)
        seq.status = SequenceStatus.RUNNING
        return events

    def extend(self, seq: Sequence, token_ids: list[int]) -> list[Event]:
        """The next chunk of a chunked prefill: like `append`, narrated as one allocation
        rather than token by token (a chunk can be thousands of tokens)."""
        self.check_append(seq, len(token_ids))
        events: list[Event] = []
        self._write(seq, token_ids, events, narrate_each=False)
        return events

    def tokens_that_fit(self, seq: Sequence, num_tokens: int) -> int:
        """How many of the next num_tokens an `extend` could take now: the slots left in the
        last block plus the allocatable blocks (a sequence mid-prefill never shares its last,
        partly filled block, so no copy-on-write is counted)."""
        slack = -seq.num_tokens % self.block_size
        return min(num_tokens, slack + self.pool.num_allocatable * self.block_size)

    def append(self, seq: Sequence, token_ids: list[int]) -> list[Event]:
        """Write tokens after the sequence's last token, one slot each (copy-on-write first
        when the last block is shared and partly filled)."""
        self.check_append(seq, len(token_ids))
        events: list[Event] = []
        self._write(seq, token_ids, events, narrate_each=True)
        return events

    def append_reserved(self, seq: Sequence, token: int, events: list[Event]) -> None:
        """`append` of one token whose block the caller has already counted (the scheduler's
        decode pass reserves them): no second capacity check in the hot path, and the common
        case (room in an unshared last block) without `_write`'s loop; the same events."""
        offset = len(seq.token_ids) % self.block_size
        block_id = seq.block_table[-1] if offset else -1
        block = self.pool.blocks[block_id] if offset else None
        if block is None or block.ref_count > 1:  # a new block, or copy-on-write first
            self._write(seq, [token], events, narrate_each=True)
            return
        block.token_ids.append(token)
        seq.token_ids.append(token)
        self.pool.dirty.add(block_id)
        events.append(self._append_event(seq.seq_id, token, block_id, offset))
        if offset == self.block_size - 1 and self.enable_prefix_caching and token != IN_FLIGHT:
            self._seal(seq, block_id, events)

    def land(self, seq: Sequence, token: int, events: list[Event]) -> None:
        """Async scheduling: the sequence's last token was written as IN_FLIGHT; now its id is
        known. Put it in the sequence and its block, and hash the block if that filled it."""
        seq.token_ids[-1] = token
        block_id = seq.block_table[-1]
        block = self.pool.blocks[block_id]
        block.token_ids[-1] = token
        self.pool.dirty.add(block_id)
        if self.enable_prefix_caching and len(block.token_ids) == self.block_size:
            self._seal(seq, block_id, events)

    def fork(self, parent: Sequence, child: Sequence) -> list[Event]:
        """The child gets a copy of the parent's block table; nothing is copied but ids."""
        child.token_ids = list(parent.token_ids)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.pending_token = parent.pending_token
        child.prompt_len = parent.prompt_len
        child.num_cached_tokens = parent.num_cached_tokens
        child.cumulative_logprob = parent.cumulative_logprob
        child.parent_id = parent.seq_id
        child.status = parent.status
        for b in child.block_table:
            self.pool.incref(b, child.seq_id)
        return [Event("share", self.step, child.seq_id, tuple(child.block_table),
                      facts=(parent.seq_id,), form="fork")]

    def free(self, seq: Sequence) -> list[Event]:
        """Let go of the whole block table. Blocks enter the LRU last block first, so the start
        of a prefix, the part most likely to be asked for again, stays cached longest."""
        released, kept = [], []
        for b in reversed(seq.block_table):
            (released if self.pool.decref(b, seq.seq_id) else kept).append(b)
        released.reverse()
        kept.reverse()
        seq.block_table = []
        # which released blocks stay cached is a fact of now: the narration is written later
        cached = tuple(b for b in released if self.pool.blocks[b].block_hash is not None)
        return [Event("free", self.step, seq.seq_id, tuple(released), facts=(cached, tuple(kept)))]

    # ---- the CPU tier of the prefix cache (num_offload_blocks) -------------------------------

    def _match_tier(self, prompt: list[int], hits: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if not self.enable_prefix_caching:
            return []
        return self.tier.match(prompt, hits[-1][1] if hits else None, len(hits), self.block_size,
                               self.hash_fn)

    def _load(self, seq: Sequence, prompt: list[int], loads: list[tuple[int, int]],
              events: list[Event]) -> None:
        """Blocks the tier holds become the sequence's next blocks: a GPU block each (the
        caller counted them), hashed again, their K/V copied back before the model runs."""
        bs, sid = self.block_size, seq.seq_id
        self._pinned().update(slot for slot, _ in loads)  # no offload may overwrite them now
        blocks = []
        for _, h in loads:
            i = len(seq.block_table)
            block_id = self._allocate(sid, events, narrate=False)
            chunk = prompt[i * bs:(i + 1) * bs]
            self.pool.blocks[block_id].token_ids = list(chunk)
            self.pool.register_hash(block_id, h)
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
            seq.token_ids += chunk
            blocks.append(block_id)
        seq.num_cached_tokens += len(loads) * bs
        self.tier.hit_blocks += len(loads)
        events.append(Event("load", self.step, sid, tuple(blocks),
                            facts=(tuple(slot for slot, _ in loads), len(loads) * bs)))

    def _pinned(self) -> set[int]:
        """The tier slots this step's loads read (the runtime offloads first, then loads)."""
        if self._loading[0] != self.step:
            self._loading = (self.step, set())
        return self._loading[1]

    # ---- swapping (preemption by swap, §4.5) -------------------------------------------------

    @staticmethod
    def distinct_blocks(seqs: list[Sequence]) -> list[int]:
        """The blocks of a group's tables, each once (its sequences may share blocks)."""
        return list(dict.fromkeys(b for s in seqs for b in s.block_table))

    def swap_out(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        """Move a group's blocks to CPU swap space. Returns events and (gpu, cpu) copy pairs;
        the caller copies the bytes before anyone reuses the GPU blocks."""
        gpu_blocks = self.distinct_blocks(seqs)
        self._require(len(gpu_blocks), self.cpu_pool.num_allocatable, "swapping out")
        pairs, events = self._move(seqs, gpu_blocks, self.pool, self.cpu_pool)
        for seq in seqs:
            seq.status = SequenceStatus.SWAPPED
        events.append(Event("swap_out", self.step, seqs[0].seq_id,
                            tuple(x for p in pairs for x in p),
                            facts=tuple(s.seq_id for s in seqs)))
        return events, pairs

    def swap_in(self, seqs: list[Sequence]) -> tuple[list[Event], list[tuple[int, int]]]:
        """Bring a swapped group back into the GPU pool. Returns events and (cpu, gpu) pairs."""
        cpu_blocks = self.distinct_blocks(seqs)
        self._require(len(cpu_blocks), self.pool.num_allocatable, "swapping in")
        pairs, events = self._move(seqs, cpu_blocks, self.cpu_pool, self.pool)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
            if self.enable_prefix_caching:  # full blocks become findable again
                for i, h in enumerate(seq.block_hashes):
                    self.pool.register_hash(seq.block_table[i], h)
        events.append(Event("swap_in", self.step, seqs[0].seq_id,
                            tuple(x for p in pairs for x in p),
                            facts=tuple(s.seq_id for s in seqs)))
        return events, pairs

    def _move(self, seqs: list[Sequence], src_blocks: list[int], src: BlockPool, dst: BlockPool
              ) -> tuple[list[tuple[int, int]], list[Event]]:
        events: list[Event] = []
        mapping: dict[int, int] = {}
        for b in src_blocks:
            owner = next(s.seq_id for s in seqs if b in s.block_table)
            if dst is self.pool:
                new = self._allocate(owner, events, narrate=False)
            else:
                new, _ = dst.allocate(owner)
            dst.blocks[new].token_ids = list(src.blocks[b].token_ids)
            mapping[b] = new
        for seq in seqs:
            for b in reversed(seq.block_table):
                src.decref(b, seq.seq_id)
            seq.block_table = [mapping[b] for b in seq.block_table]
            for b in seq.block_table:
                if seq.seq_id not in dst.blocks[b].owners:
                    dst.incref(b, seq.seq_id)
        return list(mapping.items()), events

    # ---- internals --------------------------------------------------------------------------

    def _match_prefix(self, prompt: list[int]) -> list[tuple[int, int]]:
        """Cached full blocks at the start of the prompt, as (block id, hash). Stops at the first
        miss and leaves at least one prompt token to compute (its logits give the next token)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[tuple[int, int]] = []
        parent = None
        for i in range((len(prompt) - 1) // bs):
            chunk = prompt[i * bs:(i + 1) * bs]
            h = self.hash_fn(parent, chunk)
            block_id = self.pool.lookup(h, chunk)
            if block_id is None:
                break
            hits.append((block_id, h))
            parent = h
        return hits

    def _write(self, seq: Sequence, token_ids: list[int], events: list[Event],
               narrate_each: bool, seal: bool = True) -> None:
        bs = self.block_size
        blocks = self.pool.blocks
        dirty = self.pool.dirty
        sid = seq.seq_id
        new_blocks: list[int] = []
        for tok in token_ids:
            offset = len(seq.token_ids) % bs
            if offset == 0:
                block_id = self._allocate(sid, events, narrate_each)
                seq.block_table.append(block_id)
                new_blocks.append(block_id)
            else:
                block_id = seq.block_table[-1]
                if blocks[block_id].ref_count > 1:
                    block_id = self._copy_on_write(seq, events)
            blocks[block_id].token_ids.append(tok)
            seq.token_ids.append(tok)
            dirty.add(block_id)
            if narrate_each:
                events.append(self._append_event(sid, tok, block_id, offset))
            if offset == bs - 1 and seal and self.enable_prefix_caching and tok != IN_FLIGHT:
                self._seal(seq, block_id, events)  # an in-flight token's block: when it lands
        if new_blocks and not narrate_each:
            events.append(Event("allocate", self.step, sid, tuple(new_blocks),
                                facts=(len(token_ids),), form="allocate_many"))

    def _append_event(self, sid: int, tok: int, block_id: int, offset: int) -> Event:
        # the hot path of a serving step: positional, and no text (the token is named when read)
        return Event("append", self.step, sid, (block_id,), (tok,), offset, (), "", self.token_repr)

    def _allocate(self, sid: int, events: list[Event], narrate: bool) -> int:
        pool = self.pool
        evicting = None if pool.free_ids or not pool.cached_ids else next(iter(pool.cached_ids))
        tokens = list(pool.blocks[evicting].token_ids) if evicting is not None else []
        block_id, evicted_hash = pool.allocate(sid)
        if evicted_hash is not None:
            self.evictions += 1
            events.append(Event("evict", self.step, sid, (block_id,)))
            slot = self.tier.store(evicted_hash, tokens, self._pinned())
            if slot is not None:  # its K/V go to the CPU tier before anything overwrites them
                events.append(Event("offload", self.step, sid, (block_id,),
                                    facts=(slot, evicted_hash & 0xFFFF)))
        if narrate:
            events.append(Event("allocate", self.step, sid, (block_id,)))
        return block_id

    def _copy_on_write(self, seq: Sequence, events: list[Event]) -> int:
        src = seq.block_table[-1]
        sid = seq.seq_id
        dst = self._allocate(sid, events, narrate=False)
        blocks = self.pool.blocks
        blocks[dst].token_ids = list(blocks[src].token_ids)
        self.pool.decref(src, sid)
        seq.block_table[-1] = dst
        self.cow_copies += 1
        events.append(Event("cow", self.step, sid, (src, dst), facts=(blocks[src].ref_count + 1,)))
        return dst

    def _seal(self, seq: Sequence, block_id: int, events: list[Event]) -> None:
        """A block just filled: hash it so later prompts with this prefix can share it."""
        parent = seq.block_hashes[-1] if seq.block_hashes else None
        h = self.hash_fn(parent, self.pool.blocks[block_id].token_ids)
        seq.block_hashes.append(h)
        if self.pool.register_hash(block_id, h):
            events.append(Event("cache", self.step, seq.seq_id, (block_id,), facts=(h & 0xFFFF,)))

    # ---- checks -------------------------------------------------------------------------------

    def check_invariants(self, on_gpu: list[Sequence], on_cpu: list[Sequence] = ()) -> None:
        """Raise InvariantError on any contradiction between pools, tables and the hash map."""
        check_pool(self.pool, on_gpu, self.block_size, "")
        check_pool(self.cpu_pool, list(on_cpu), self.block_size, "cpu ")
        if problem := self.tier.check():
            raise InvariantError(problem)
        for h, b in self.pool.hash_to_block.items():
            if self.pool.blocks[b].block_hash != h:
                raise InvariantError(f"hash map entry {h:x} points at block {b}, which holds another hash")
