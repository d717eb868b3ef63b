"""The CPU tier's bytes at the speed of the bus: contiguous slots in pinned host memory, copied by
the DMA engines on streams of their own.

The pool lays a block out by layer (`kv_cache[layer, k/v, block, ...]`, the layout the attention
kernels read), so one block's K/V are 2 x layers pieces of a few KB each; copied piece by piece
over PCIe they reach a few GB/s. The tier lays each slot out whole instead,

    tier[slot, page_layers, 2, block_size, kv_heads, head_dim]

one contiguous run of bytes a block (0.5 MB for a Llama-3.2-1B-shaped model), and a copy goes in
two moves: on the device, a gather of the blocks' pieces into a contiguous staging buffer (or a
scatter out of one: device memory is fast), and over the bus one `cudaMemcpyAsync` per run of
consecutive slots, from or into pinned memory (the DMA engines, not the SMs).

Where each move runs, so that neither kind of copy holds up the batch:

- **offload** (an evicted cached block into a slot): the gather runs on the compute stream, in the
  step's order, so the block can be written by its new owner right after; the copy to the host
  runs on a low-priority stream and nothing waits for it but a later copy of the same slot;
- **load** (a prefix hit in the tier back into pool blocks): on a high-priority stream, the copy
  from the host into a staging buffer (started as soon as the bookkeeping knows the load,
  before it allocates and evicts for it: `fetch_ahead`; a slot an offload of the step writes
  is read again after it), then, after
  what the compute stream had queued (the blocks' previous bytes may still be read by an
  offload's gather), the scatter into the blocks. The forward pass that reads them waits on
  the load's event, not on the device: the same step's when the request runs alone, else the
  next one's (beside other requests it waits a step, so that their passes never wait for it).

Every copy of a slot waits for the one before it of that slot (an offload into a slot a load is
still reading, a load of a slot an offload is still writing). On a CPU both moves are plain copies.
"""

from __future__ import annotations

from collections.abc import Collection
from operator import itemgetter
from typing import Any

import torch

from engine.core.scheduler import TIER_LOAD_CHUNK  # a load beside decodes: a step's blocks
from engine.runtime.transfer import to_device

_SLOT = itemgetter(1)


class TierCopies:
    """The tier's host memory and the copies in and out of the pool `kv_cache`."""

    def __init__(self, kv_cache: torch.Tensor, num_slots: int) -> None:
        page = kv_cache.shape[:2] + kv_cache.shape[3:]  # [page_layers, 2, bs, heads, dim]
        self.device = kv_cache.device
        cuda = self.device.type == "cuda"
        self.slots = torch.zeros((num_slots, *page), dtype=kv_cache.dtype, pin_memory=cuda)
        self.num_slots = num_slots
        self.slot_bytes = self.slots[0].numel() * self.slots.element_size() if num_slots else 0
        # copies over the bus and their bytes, each way: a prefix's blocks in consecutive slots
        # go in one copy (the benchmarks report the bytes a copy moves)
        self.bus_copies = {"out": 0, "in": 0}
        self.bus_bytes = {"out": 0, "in": 0}
        self._slot_event: dict[int, Any] = {}  # a slot's last copy, for the next one to wait on
        self._block_event: dict[int, Any] = {}  # a loaded block: its forward waits on this
        self._staged: torch.Tensor | None = None  # the loads' staging buffer, see _staging
        self._ahead_buf: torch.Tensor | None = None  # where `fetch_ahead` copies to
        self._ahead_rows = 0  # its rows in use (fetched and not yet loaded)
        self._ahead: dict[int, tuple[torch.Tensor, int]] = {}  # a fetched slot: (buffer, row)
        if cuda:
            low, high = torch.cuda.Stream.priority_range()
            self._offload_stream = torch.cuda.Stream(self.device, priority=low)
            self._load_stream = torch.cuda.Stream(self.device, priority=high)

    # ---- the two copies ----------------------------------------------------------------------

    @torch.inference_mode()
    def offload(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Pool block -> tier slot for every (block, slot)."""
        blocks, slots = _ids(sorted(pairs, key=_SLOT))  # by slot: runs go in one copy
        staged = _gather(kv_cache, blocks)  # on the compute stream: the block is free after it
        if self.device.type != "cuda":
            self.slots[slots] = staged
            return
        gathered = torch.cuda.Event()
        gathered.record()
        with torch.cuda.stream(self._offload_stream):
            self._offload_stream.wait_event(gathered)
            self._wait_slots(self._offload_stream, slots)
            for first, last, at in self._count(slots, "out"):
                self.slots[first:last].copy_(staged[at:at + last - first], non_blocking=True)
            staged.record_stream(self._offload_stream)  # not reused before this stream read it
            done = torch.cuda.Event()
            done.record()
        self._slot_event.update(dict.fromkeys(slots, done))
        if self._ahead:  # fetched bytes of a slot written since are not its bytes
            for s in slots:
                self._ahead.pop(s, None)

    @torch.inference_mode()
    def load(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Tier slot -> pool block for every (slot, block)."""
        slots, blocks = _ids(sorted(pairs))  # by slot: runs of consecutive slots go in one copy
        if self.device.type != "cuda":
            _scatter(kv_cache, blocks, self.slots[slots])
            return
        queued = torch.cuda.Event()
        queued.record()  # whatever the compute stream still does with these blocks
        with torch.cuda.stream(self._load_stream):
            staged = self._fetched(slots)
            if staged is None:
                self._wait_slots(self._load_stream, slots)
                staged = self._staging(len(slots))
                for first, last, at in self._count(slots, "in"):
                    staged[at:at + last - first].copy_(self.slots[first:last], non_blocking=True)
            # only the scatter waits for it: the bus copy into staging overlaps an offload's
            # gather of these very blocks (their old bytes) still queued on the compute stream
            self._load_stream.wait_event(queued)
            _scatter(kv_cache, blocks, staged)
            done = torch.cuda.Event()
            done.record()
        self._slot_event.update(dict.fromkeys(slots, done))
        self._block_event.update(dict.fromkeys(blocks, done))

    @torch.inference_mode()
    def fetch_ahead(self, slots: list[int]) -> None:
        """Start the bus copy of these slots now, for loads of them later in the step (`load`):
        the bookkeeping asks as soon as it knows a prompt's blocks come from the tier, before
        it allocates and evicts for them (engine/core/tier_loads.py), so the copy runs beside
        the rest of the schedule and the offloads of the blocks the load evicts (a load's
        scatter waits for their gathers, its copy over the bus need not). Slots fetched before
        and not written since are not fetched again. Into a buffer of its own, kept like the
        staging buffer. On a CPU: nothing."""
        if self.device.type != "cuda":
            return
        ordered = sorted(set(slots).difference(self._ahead))
        if not ordered:
            return
        if not self._ahead:
            self._ahead_rows = 0  # every row loaded: the buffer is free again (in stream order)
        with torch.cuda.stream(self._load_stream):  # the buffer's memory follows this stream
            at = self._ahead_rows
            if self._ahead_buf is None or len(self._ahead_buf) < at + len(ordered):
                # a new buffer for these rows; fetched rows not yet loaded keep the old one
                size = max(len(ordered), len(self._ahead_buf) if self._ahead_buf is not None else 0)
                self._ahead_buf = torch.empty((size, *self.slots.shape[1:]),
                                              dtype=self.slots.dtype, device=self.device)
                at = 0
            self._wait_slots(self._load_stream, ordered)
            buf = self._ahead_buf
            for first, last, i in self._count(ordered, "in"):
                buf[at + i:at + i + last - first].copy_(self.slots[first:last], non_blocking=True)
            fetched = torch.cuda.Event()
            fetched.record()
        for i, s in enumerate(ordered):
            self._slot_event[s] = fetched  # an offload into it waits until the bus read it
            self._ahead[s] = (buf, at + i)
        self._ahead_rows = at + len(ordered)

    def _fetched(self, slots: list[int]) -> torch.Tensor | None:
        """These slots' bytes from the copies `fetch_ahead` started (on the load stream, so
        after them), or None when it did not fetch them all (this load reads them all from
        the host: the rows it fetched are let go)."""
        rows = [self._ahead.pop(s, None) for s in slots]  # each fetched once: its load takes it
        if None in rows:
            return None
        buf, first = rows[0]
        if all(b is buf and r == first + i for i, (b, r) in enumerate(rows)):
            return buf[first:first + len(rows)]
        return torch.stack([b[r] for b, r in rows])

    @property
    def pending(self) -> bool:
        """Whether a load's blocks have not been waited for yet."""
        return bool(self._block_event)

    def wait_for_blocks(self, blocks: Collection[int]) -> None:
        """The compute stream waits (on the device) for the loads of these blocks, if any: once
        a load. The loads in flight are few blocks, a step's tables many (a load step's 32
        decoders read ~1,300): the pending ones are looked up in the step's, not the other way."""
        stream = torch.cuda.current_stream(self.device)
        for event in take_loads(self._block_event, blocks):
            stream.wait_event(event)

    def read(self, slot: int) -> torch.Tensor:
        """A slot's bytes, [page_layers, 2, bs, heads, dim], once its copies are done."""
        event = self._slot_event.get(slot)
        if event is not None:
            event.synchronize()
        return self.slots[slot]

    # ---- internals -----------------------------------------------------------------------------

    def _count(self, slots: list[int], way: str) -> list[tuple[int, int, int]]:
        """The runs of consecutive slots, one copy each, counted with their bytes."""
        runs = _runs(slots)
        self.bus_copies[way] += len(runs)
        self.bus_bytes[way] += len(slots) * self.slot_bytes
        return runs

    def _staging(self, n: int) -> torch.Tensor:
        """n slots' worth of the loads' staging buffer, kept for the engine's life (grown when a
        load is larger) rather than taken from the caching allocator at every load, where a
        pool with no free block of the size takes new device memory, which synchronises.
        Only the load stream uses it, so a load's copy into it is ordered after the last
        load's scatter out of it."""
        if self._staged is None or len(self._staged) < n:
            self._staged = torch.empty((max(n, TIER_LOAD_CHUNK), *self.slots.shape[1:]),
                                       dtype=self.slots.dtype, device=self.device)
        return self._staged[:n]

    def _wait_slots(self, stream: Any, slots: list[int]) -> None:
        # each slot's last copy once (a prefix's slots share one), looked up in C: a copy's host
        # part is paid before its bus time starts
        for event in dict.fromkeys(map(self._slot_event.get, slots)):
            if event is not None:
                stream.wait_event(event)


def take_loads(pending: dict[int, Any], blocks: Collection[int]) -> list[Any]:
    """The loads (events) that write any of `blocks`, each once, taken out of `pending`
    (block -> its load's event) with every block they write: the stream that waits for a load
    once (always the compute stream) has every later read of its blocks after it."""
    wanted = blocks if isinstance(blocks, set | frozenset) else set(blocks)
    events = dict.fromkeys(map(pending.__getitem__, wanted.intersection(pending)))  # in C
    if events:
        for b in [b for b, e in pending.items() if e in events]:
            del pending[b]
    return list(events)


def _ids(pairs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    if not pairs:
        return [], []
    firsts, seconds = zip(*pairs, strict=True)
    return list(map(int, firsts)), list(map(int, seconds))


def _gather(kv_cache: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    """[n, page_layers, 2, bs, heads, dim]: each block's pieces, contiguous, in one pass (an
    index of the block-major view: `index_select` then a contiguous copy read and wrote the
    bytes twice, on the compute stream, before the step's forward pass; 2.3x slower on the
    2-core CPU for 100 blocks of a 1B shape)."""
    idx = to_device(blocks, torch.long, kv_cache.device)
    return kv_cache.permute(2, 0, 1, 3, 4, 5)[idx]


def _scatter(kv_cache: torch.Tensor, blocks: list[int], staged: torch.Tensor) -> None:
    idx = to_device(blocks, torch.long, kv_cache.device)
    kv_cache.index_copy_(2, idx, staged.permute(1, 2, 0, 3, 4, 5))


def _runs(slots: list[int]) -> list[tuple[int, int, int]]:
    """(first slot, one past the last, index in `slots`) of each run of consecutive slots."""
    if slots and slots[-1] - slots[0] == len(slots) - 1:  # sorted, each once: one run
        return [(slots[0], slots[-1] + 1, 0)]
    runs, start = [], 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            runs.append((slots[start], slots[i - 1] + 1, start))
            start = i
    return runs
