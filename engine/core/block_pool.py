"""The physical block pool: ref counts, the free queue, the LRU of cached blocks, the hash map.

A block is in exactly one of three states:

- **used**: ref_count >= 1, it is in at least one block table;
- **cached**: ref_count == 0 but it holds a hash, so a later prompt with the same prefix can reuse
  its K/V; it is evictable, least recently freed first;
- **free**: ref_count == 0 and no hash.

Allocation takes never-hashed free blocks first and evicts the least-recently-used cached block
only when none is left. This file knows nothing about sequences or tensors (vLLM v1's BlockPool).

A hybrid model's KV cache groups (engine/core/kv_groups.py) share the pool: a block serves the
group that allocated it, and the hash map is keyed by (group, hash), so a full-attention block and
a sliding-window block holding the same tokens never answer for each other.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(slots=True)  # hundreds of them touched a step: slots read and write faster
class Block:
    """One physical block of block_size token slots."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: list[int] = field(default_factory=list)  # tokens whose K/V the block holds
    owners: dict[int, None] = field(default_factory=dict)  # seq ids, in the order they came
    group: int = 0  # the KV cache group whose layers its page holds (0 for most models)

    @property
    def state(self) -> str:
        if self.ref_count > 0:
            return "used"
        return "cached" if self.block_hash is not None else "free"


class PoolState(NamedTuple):
    """A pool's state as plain data, copied (a checkpoint's part: engine/checkpoint.py)."""

    blocks: tuple[tuple[int, int | None, tuple[int, ...], tuple[int, ...], int], ...]
    free_ids: tuple[int, ...]
    cached_ids: tuple[int, ...]  # LRU order
    hash_to_block: tuple[tuple[tuple[int, int], int], ...]


class OutOfBlocks(RuntimeError):
    """The pool cannot give the blocks an operation needs. Nothing was changed."""


class BlockPool:
    # declared state (engine/core/state.py): what a checkpoint copies, what is fixed, what is
    # kept for readers
    STATE = ("blocks", "free_ids", "cached_ids", "hash_to_block")
    FIXED = ("num_blocks", "block_size")
    DERIVED = ("_log", "_log_start")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.cached_ids: OrderedDict[int, None] = OrderedDict()  # LRU order: first = evict next
        self.hash_to_block: dict[tuple[int, int], int] = {}  # (group, hash) -> block
        # every block this pool's mutators changed, in order: readers (the snapshot builder)
        # keep a mark into it and read what changed since (`changes_since`); nobody else has to
        # remember to say a block changed, since every change goes through a method here
        self._log: list[int] = []
        self._log_start = 0  # marks before this were dropped: their readers rebuild everything

    def state(self) -> PoolState:
        """Everything this pool holds, as plain data (its sizes are fixed at construction)."""
        return PoolState(
            tuple((b.ref_count, b.block_hash, tuple(b.token_ids), tuple(b.owners), b.group)
                  for b in self.blocks),
            tuple(self.free_ids), tuple(self.cached_ids), tuple(self.hash_to_block.items()))

    def load_state(self, state: PoolState) -> None:
        """Back to `state` (from `state()` of a pool of this size), in place: the parts that
        hold this pool keep holding it. Every block counts as changed."""
        if len(state.blocks) != self.num_blocks:
            raise ValueError(f"a state of {len(state.blocks)} blocks cannot load into a pool of "
                             f"{self.num_blocks}")
        for block, (rc, h, tokens, owners, group) in zip(self.blocks, state.blocks, strict=True):
            block.ref_count, block.block_hash, block.group = rc, h, group
            block.token_ids = list(tokens)
            block.owners = dict.fromkeys(owners)
        self.free_ids = deque(state.free_ids)
        self.cached_ids = OrderedDict.fromkeys(state.cached_ids)
        self.hash_to_block = dict(state.hash_to_block)
        self.forget_changes()

    @property
    def num_allocatable(self) -> int:
        """Blocks a new allocation can get: free ones, then cached ones by eviction."""
        return len(self.free_ids) + len(self.cached_ids)

    def allocate(self, owner: int, group: int = 0) -> tuple[int, int | None]:
        """Take one block for `owner`'s table in `group`. Returns (block id, hash it was evicted
        from or None)."""
        ids, evicted = self.allocate_many(owner, [group])
        return ids[0], evicted[0][1] if evicted else None

    def allocate_many(self, owner: int, groups: list[int]
                      ) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
        """`allocate` once for each entry of `groups` (the group each block serves), in order, as
        one operation: the same blocks and evictions as that many calls, without their per-call
        overhead (a long prompt takes hundreds of blocks in a step). Returns (the block ids, and
        (block id, hash, the tokens it held) of every evicted block, in order). Raises
        OutOfBlocks, changing nothing, when the pool cannot give them all."""
        if len(groups) > len(self.free_ids) + len(self.cached_ids):
            raise OutOfBlocks(f"{len(groups)} block(s) asked for, but the pool has only "
                              f"{self.num_allocatable} free or cached")
        free, cached, blocks, by_hash = self.free_ids, self.cached_ids, self.blocks, self.hash_to_block
        ids: list[int] = []
        evicted: list[tuple[int, int, list[int]]] = []
        for group in groups:
            if free:
                block_id = free.popleft()
                block = blocks[block_id]
            else:
                block_id, _ = cached.popitem(last=False)
                block = blocks[block_id]
                h, block.block_hash = block.block_hash, None  # its hash no longer finds it
                if by_hash.get(key := (block.group, h)) == block_id:
                    del by_hash[key]
                evicted.append((block_id, h, block.token_ids))
            block.ref_count = 1
            block.token_ids = []
            owners = block.owners  # emptied in place: no new dict a block (fewer for the GC)
            owners.clear()
            owners[owner] = None
            block.group = group
            ids.append(block_id)
        self._log += ids
        if len(self._log) > 4 * self.num_blocks + 1024:  # a log nobody read for long: drop it
            self._log_start += len(self._log)
            self._log = []
        return ids, evicted

    def incref(self, block_id: int, owner: int) -> None:
        """One more block-table entry points at this block (fork or prefix hit)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.cached_ids[block_id]  # a cached block becomes used again
        block.ref_count += 1
        block.owners[owner] = None
        self._log.append(block_id)

    def decref(self, block_id: int, owner: int) -> bool:
        """One block-table entry lets go. Returns True when the block's ref count reached 0."""
        return bool(self.decref_many([block_id], owner))

    def decref_many(self, block_ids: list[int], owner: int) -> list[int]:
        """`decref` each block in turn, as one operation (a long prompt's window passes hundreds
        of blocks at once). Returns the blocks whose ref count reached 0, in that order."""
        blocks, cached, free = self.blocks, self.cached_ids, self.free_ids
        released = []
        for block_id in block_ids:
            block = blocks[block_id]
            block.ref_count -= 1
            block.owners.pop(owner, None)
            if block.ref_count > 0:
                continue
            if block.block_hash is not None:
                cached[block_id] = None  # most recently used end
            else:
                block.token_ids = []
                free.append(block_id)
            released.append(block_id)
        self._log += block_ids
        return released

    def register_hash(self, block_id: int, block_hash: int) -> bool:
        """Make a full block findable by its hash. False when the hash already names another
        block: that one keeps serving hits (no deduplication after the fact)."""
        block = self.blocks[block_id]
        key = (block.group, block_hash)
        if key in self.hash_to_block:
            return False
        block.block_hash = block_hash
        self.hash_to_block[key] = block_id
        self._log.append(block_id)
        return True

    def register_many(self, block_ids: list[int], hashes: list[int]) -> None:
        """`register_hash` for each block with its hash, as one operation (a prefix's hundreds
        of blocks loaded from the tier)."""
        blocks, table = self.blocks, self.hash_to_block
        for block_id, block_hash in zip(block_ids, hashes, strict=True):
            block = blocks[block_id]
            key = (block.group, block_hash)
            if key not in table:
                block.block_hash = block_hash
                table[key] = block_id
        self._log += block_ids

    # ---- a block's tokens (every write goes through here: the change log stays true) ----------

    def append_token(self, block_id: int, token: int) -> None:
        """One more token's K/V in the block's next slot."""
        self.blocks[block_id].token_ids.append(token)
        self._log.append(block_id)

    def append_tokens(self, block_ids: list[int], tokens: list[int]) -> None:
        """`append_token` for each block and its token, as one operation (a decode step's)."""
        blocks = self.blocks
        for block_id, token in zip(block_ids, tokens, strict=True):
            blocks[block_id].token_ids.append(token)
        self._log += block_ids

    def extend_tokens(self, block_id: int, token_ids: list[int]) -> None:
        """More tokens' K/V in the block's next slots (a prompt's, a block at a time)."""
        self.blocks[block_id].token_ids += token_ids
        self._log.append(block_id)

    def fill_blocks(self, block_ids: list[int], chunks: list[list[int]], per_chunk: int) -> None:
        """New blocks' tokens, `per_chunk` blocks for each chunk in turn (one per KV cache
        group: a prompt's new blocks, as `BlockWriter.write` takes them)."""
        blocks = self.blocks
        for j, chunk in enumerate(chunks):
            for b in block_ids[j * per_chunk:(j + 1) * per_chunk]:
                blocks[b].token_ids = list(chunk)
        self._log += block_ids

    def set_last_token(self, block_id: int, token: int) -> None:
        """Async scheduling: the last slot's token, known now."""
        self.blocks[block_id].token_ids[-1] = token
        self._log.append(block_id)

    def set_tokens(self, block_id: int, token_ids: list[int]) -> None:
        """The block holds these tokens (a copy's destination: copy-on-write, swap, load)."""
        self.blocks[block_id].token_ids = list(token_ids)
        self._log.append(block_id)

    def truncate(self, block_id: int, num_tokens: int) -> None:
        """Keep the block's first num_tokens slots (rejected draft tokens rolled back)."""
        del self.blocks[block_id].token_ids[num_tokens:]
        self._log.append(block_id)

    def changes_since(self, mark: int) -> tuple[list[int] | None, int]:
        """(the blocks changed since `mark`, in order, repeats included; None: the log no
        longer reaches back that far, so every block may have changed) and the mark for now."""
        end = self._log_start + len(self._log)
        if mark < self._log_start:
            return None, end
        return self._log[mark - self._log_start:], end

    def forget_changes(self) -> None:
        """Every block may have changed (the pool was loaded from a checkpoint): every reader's
        next `changes_since` says None."""
        self._log_start += len(self._log) + 1
        self._log = []

    def lookup(self, block_hash: int, token_ids: list[int], group: int = 0) -> int | None:
        """The block of `group` holding exactly these tokens under this hash, or None. Comparing
        the stored tokens rules out a hash collision."""
        block_id = self.hash_to_block.get((group, block_hash))
        if block_id is None or self.blocks[block_id].token_ids != token_ids:
            return None
        return block_id
