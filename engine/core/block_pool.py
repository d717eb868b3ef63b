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


@dataclass
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


class OutOfBlocks(RuntimeError):
    """The pool cannot give the blocks an operation needs. Nothing was changed."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.cached_ids: OrderedDict[int, None] = OrderedDict()  # LRU order: first = evict next
        self.hash_to_block: dict[tuple[int, int], int] = {}  # (group, hash) -> block
        self.dirty: set[int] = set(range(num_blocks))  # blocks changed since the last snapshot

    @property
    def num_allocatable(self) -> int:
        """Blocks a new allocation can get: free ones, then cached ones by eviction."""
        return len(self.free_ids) + len(self.cached_ids)

    def allocate(self, owner: int, group: int = 0) -> tuple[int, int | None]:
        """Take one block for `owner`'s table in `group`. Returns (block id, hash it was evicted
        from or None)."""
        evicted_hash = None
        if self.free_ids:
            block_id = self.free_ids.popleft()
        elif self.cached_ids:
            block_id, _ = self.cached_ids.popitem(last=False)
            evicted_hash = self._drop_hash(block_id)
        else:
            raise OutOfBlocks("no free or cached block left in the pool")
        block = self.blocks[block_id]
        block.ref_count = 1
        block.token_ids = []
        block.owners = {owner: None}
        block.group = group
        self.dirty.add(block_id)
        return block_id, evicted_hash

    def incref(self, block_id: int, owner: int) -> None:
        """One more block-table entry points at this block (fork or prefix hit)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.cached_ids[block_id]  # a cached block becomes used again
        block.ref_count += 1
        block.owners[owner] = None
        self.dirty.add(block_id)

    def decref(self, block_id: int, owner: int) -> bool:
        """One block-table entry lets go. Returns True when the block's ref count reached 0."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        block.owners.pop(owner, None)
        self.dirty.add(block_id)
        if block.ref_count > 0:
            return False
        if block.block_hash is not None:
            self.cached_ids[block_id] = None  # most recently used end
        else:
            block.token_ids = []
            self.free_ids.append(block_id)
        return True

    def register_hash(self, block_id: int, block_hash: int) -> bool:
        """Make a full block findable by its hash. False when the hash already names another
        block: that one keeps serving hits (no deduplication after the fact)."""
        block = self.blocks[block_id]
        key = (block.group, block_hash)
        if key in self.hash_to_block:
            return False
        block.block_hash = block_hash
        self.hash_to_block[key] = block_id
        self.dirty.add(block_id)
        return True

    def lookup(self, block_hash: int, token_ids: list[int], group: int = 0) -> int | None:
        """The block of `group` holding exactly these tokens under this hash, or None. Comparing
        the stored tokens rules out a hash collision."""
        block_id = self.hash_to_block.get((group, block_hash))
        if block_id is None or self.blocks[block_id].token_ids != token_ids:
            return None
        return block_id

    def _drop_hash(self, block_id: int) -> int | None:
        block = self.blocks[block_id]
        h = block.block_hash
        if h is not None and self.hash_to_block.get((block.group, h)) == block_id:
            del self.hash_to_block[(block.group, h)]
        block.block_hash = None
        return h
