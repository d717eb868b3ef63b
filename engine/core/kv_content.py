"""What each physical KV slot holds, as the device holds it: a torch-free shadow of the K/V bytes.

The bookkeeping moves a block's token ids at once, so its tables always agree with themselves
(engine/core/invariants.py). The device moves bytes later: the step's copies, then the forward
pass's writes. `KVContent` receives exactly what the runtime receives, the same copy calls in the
same order and a write for every token a forward pass computes, and moves labels where the device
moves bytes. A slot's label says what its K/V were computed from: the position, a hash of every
token before it, and the token. After an operation, each sequence's tables must read back its
own labels (`check`): a copy run in the wrong order, or a block handed out while a copy still had
to read it, shows up here without a model, where the real engine would compute a wrong token.

Under async scheduling a step writes the K/V of a token still on the device (IN_FLIGHT); its
label holds a `Landing` that the token fills in when it lands (`land`), in every copy at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.block_pool import BlockPool
from engine.core.invariants import InvariantError
from engine.core.offload_tier import OffloadTier
from engine.core.sequence import IN_FLIGHT, Sequence, SequenceStatus

Label = tuple[int, int, "int | Landing"]  # (position, hash of the tokens before it, token)


class Landing:
    """The token of an IN_FLIGHT write: unknown until its step lands."""

    __slots__ = ("token",)

    def __init__(self) -> None:
        self.token = IN_FLIGHT


def chain(prev: int, token: int) -> int:
    """The hash of a prefix one token longer (tuples of ints hash the same in every process)."""
    return hash((prev, token))


class KVContent:
    """Labels of the GPU pool's, the CPU swap space's and the CPU tier's slots."""

    # declared state (engine/core/state.py); a checkpoint is taken with nothing in flight, so
    # every label's token is known (a landed `Landing` never changes again: shared as it is)
    STATE = ("spaces", "_prefix", "_landing", "touched")
    FIXED = ("block_size",)

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.spaces: dict[str, dict[int, Label]] = {"gpu": {}, "cpu": {}, "tier": {}}
        self._prefix: dict[int, list[int]] = {}  # seq id -> hash of its tokens 0..i, cached
        self._landing: dict[tuple[int, int], Landing] = {}  # (seq id, position) -> its label's token
        self.touched = _no_blocks()  # blocks written since the last `verify`, by space

    def state(self) -> tuple:
        if self._landing:
            raise ValueError("a step is in flight: its tokens are not known yet")
        return ({name: dict(slots) for name, slots in self.spaces.items()},
                {sid: list(keys) for sid, keys in self._prefix.items()},
                {name: set(blocks) for name, blocks in self.touched.items()})

    def load_state(self, state: tuple) -> None:
        spaces, prefix, touched = state
        self.spaces = {name: dict(slots) for name, slots in spaces.items()}
        self._prefix = {sid: list(keys) for sid, keys in prefix.items()}
        self.touched = {name: set(blocks) for name, blocks in touched.items()}
        self._landing = {}

    # ---- what the device does ---------------------------------------------------------------

    def write(self, seq: Sequence, start: int) -> None:
        """A forward pass computed the sequence's tokens from `start` on into its slots (every
        KV cache group's table: each layer writes its own group's page)."""
        bs = self.block_size
        tokens = seq.token_ids
        keys = self._keys(seq, start)
        gpu = self.spaces["gpu"]
        touched = self.touched["gpu"]
        tables = seq.block_tables
        for p in range(start, len(tokens)):
            token = tokens[p]
            label_token: int | Landing = token
            if token == IN_FLIGHT:
                label_token = self._landing.setdefault((seq.seq_id, p), Landing())
            label = (p, keys[p - 1] if p else 0, label_token)
            i, offset = divmod(p, bs)
            for table in tables:
                block = table[i]
                if block is not None:
                    gpu[block * bs + offset] = label
                    touched.add(block)
            if token != IN_FLIGHT:
                keys.append(chain(keys[p - 1] if p else 0, token))

    def land(self, seq_id: int, position: int, token: int) -> None:
        """Async scheduling: the token an earlier write computed K/V for is known now."""
        landing = self._landing.pop((seq_id, position), None)
        if landing is not None:
            landing.token = token

    def forget(self, seq_id: int) -> None:
        """The sequence let go of its blocks: its cached prefix hashes go (a recomputed
        sequence computes them again)."""
        self._prefix.pop(seq_id, None)
        for key in [k for k in self._landing if k[0] == seq_id]:
            del self._landing[key]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self._copy("gpu", "gpu", pairs)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        self._copy("gpu", "cpu", pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        self._copy("cpu", "gpu", pairs)

    def offload(self, pairs: list[tuple[int, int]]) -> None:
        self._copy("gpu", "tier", pairs)

    def load(self, pairs: list[tuple[int, int]]) -> None:
        self._copy("tier", "gpu", pairs)

    def _copy(self, src_space: str, dst_space: str, pairs: list[tuple[int, int]]) -> None:
        bs = self.block_size
        src, dst = self.spaces[src_space], self.spaces[dst_space]
        touched = self.touched[dst_space]
        for s, d in pairs:
            touched.add(d)
            for o in range(bs):
                label = src.get(s * bs + o)
                if label is None:
                    dst.pop(d * bs + o, None)
                else:
                    dst[d * bs + o] = label

    def _keys(self, seq: Sequence, start: int) -> list[int]:
        """The cached prefix hashes of the sequence, valid for its tokens before `start`."""
        keys = self._prefix.setdefault(seq.seq_id, [])
        del keys[start:]  # rewritten from here (a draft rolled back, a recompute)
        tokens = seq.token_ids
        for p in range(len(keys), start):
            keys.append(chain(keys[p - 1] if p else 0, tokens[p]))
        return keys

    # ---- the check ------------------------------------------------------------------------------

    def verify(self, seqs: dict[int, Sequence], pool: BlockPool, cpu_pool: BlockPool,
               tier: OffloadTier, everything: bool = True, shared: Iterable[int] = ()) -> None:
        """Raise InvariantError where a sequence's tables do not read back its own tokens at its
        own positions (a running one from the GPU pool, a swapped one from swap space), or a
        cached block or tier slot does not hold its tokens. `everything=True` reads every
        sequence and block. Otherwise (the check after each operation) only what changed: the
        blocks written since the last call, and `shared`, blocks that became part of another
        table without a write (a prefix hit, a fork), each read through the tables holding it."""
        touched, self.touched = self.touched, _no_blocks()
        if everything:
            for seq in seqs.values():
                space = _SPACE.get(seq.status)
                if space is not None:
                    self._check_seq(seq, space)
            cached: Iterable[int] = list(pool.cached_ids)
            slots: Iterable[int] = [slot for slot, _ in tier.entries.values()]
            for sid in [s for s in self._prefix if s not in seqs]:
                del self._prefix[sid]
        else:
            gpu = touched["gpu"].union(shared)
            for space, blocks_pool, blocks in (("gpu", pool, gpu), ("cpu", cpu_pool, touched["cpu"])):
                held: dict[int, set[int]] = {}
                for b in blocks:
                    for sid in blocks_pool.blocks[b].owners:
                        held.setdefault(sid, set()).add(b)
                for sid, mine in held.items():
                    seq = seqs.get(sid)
                    if seq is not None and _SPACE.get(seq.status) == space:
                        self._check_seq(seq, space, mine)
            cached = [b for b in gpu if pool.blocks[b].state == "cached"]
            slots = touched["tier"]
        self.check_blocks("gpu", ((b, pool.blocks[b].token_ids) for b in cached))
        entries = {slot: tokens for slot, tokens in tier.entries.values()}
        self.check_blocks("tier", ((s, entries[s]) for s in slots if s in entries))

    def _check_seq(self, seq: Sequence, space: str, only: set[int] | None = None) -> None:
        """Every slot of the sequence's tables (`only`: of these blocks), against its tokens. A
        full read hashes the prefix afresh; a partial one takes the hashes the writes cached."""
        bs = self.block_size
        slots = self.spaces[space]
        tokens = seq.token_ids
        n = len(tokens)
        if only is None:
            prev = 0
            for p, token in enumerate(tokens):
                i, offset = divmod(p, bs)
                for g, table in enumerate(seq.block_tables):
                    self._check_slot(seq, slots, space, g, table[i], p, prev)
                prev = chain(prev, token)
            return
        for g, table in enumerate(seq.block_tables):
            for i, block in enumerate(table):
                if block in only:
                    for p in range(i * bs, min(n, (i + 1) * bs)):
                        self._check_slot(seq, slots, space, g, block, p, self._key_before(seq, p))

    def _check_slot(self, seq: Sequence, slots: dict[int, Label], space: str, g: int,
                    block: int | None, p: int, prev: int) -> None:
        if block is None:  # a sliding window dropped it
            return
        bs = self.block_size
        token = seq.token_ids[p]
        label = slots.get(block * bs + p % bs)
        if label is None or label[0] != p or label[1] != prev or _token(label) != token:
            raise InvariantError(
                f"seq {seq.seq_id}: {space} block {block} (table {g}, entry {p // bs}) slot "
                f"{p % bs} should hold the K/V of its token {token} at position {p}, "
                f"but holds {_describe(label, p, prev)}")

    def _key_before(self, seq: Sequence, p: int) -> int:
        """The hash of the sequence's tokens before position p (cached; extended as needed)."""
        if not p:
            return 0
        keys = self._prefix.setdefault(seq.seq_id, [])
        tokens = seq.token_ids
        for q in range(len(keys), p):
            keys.append(chain(keys[q - 1] if q else 0, tokens[q]))
        return keys[p - 1]

    def check_blocks(self, space: str, blocks: Iterable[tuple[int, Iterable[int]]]) -> None:
        """Blocks no sequence holds but a prefix hit may take (cached GPU blocks, tier slots):
        each (block id, token ids) holds the K/V of its own tokens, at positions of its slots."""
        bs = self.block_size
        slots = self.spaces[space]
        for block, tokens in blocks:
            for o, token in enumerate(tokens):
                label = slots.get(block * bs + o)
                if label is None or _token(label) != token or label[0] % bs != o:
                    raise InvariantError(f"{space} block {block} slot {o} should hold the K/V of "
                                         f"token {token}, but holds {_describe(label)}")


_SPACE = {SequenceStatus.RUNNING: "gpu", SequenceStatus.SWAPPED: "cpu"}  # where its tables point


def _no_blocks() -> dict[str, set[int]]:
    return {"gpu": set(), "cpu": set(), "tier": set()}


def _token(label: Label) -> int:
    t = label[2]
    return t.token if isinstance(t, Landing) else t


def _describe(label: Label | None, position: int | None = None, prefix: int | None = None) -> str:
    if label is None:
        return "nothing (never written)"
    text = f"token {_token(label)} at position {label[0]}"
    if label[0] == position and label[1] != prefix:
        text += " computed after other tokens (another sequence's K/V)"
    return text
