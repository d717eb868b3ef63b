"""The CPU tier's bytes at the speed of the bus: slots in pinned host memory, laid out by parts of
the layers, copied by the DMA engines on streams of their own.

The pool lays a block out by layer (`kv_cache[layer, k/v, block, ...]`, the layout the attention
kernels read), so one block's K/V are 2 x layers pieces of a few KB each; copied piece by piece
over PCIe they reach a few GB/s. The tier lays its slots out by *part* instead: the page's layers
in `num_parts` equal ranges (up to TIER_PARTS), and each part of every slot one run of bytes,

    store[part, slot, part_layers, 2, block_size, kv_heads, head_dim]

so a prefix's blocks in consecutive slots move in one copy a part (0.5 MB a block for a
Llama-3.2-1B-shaped model, a quarter of it a part), in two moves: on the device, a gather of the
blocks' pieces into a contiguous staging buffer (or a scatter out of one: device memory is
fast), and over the bus one `cudaMemcpyAsync` per part and run of consecutive slots, from or into
pinned memory (the DMA engines, not the SMs).

Why parts: a load brings the first layers' bytes back first, and a forward pass that reads the
load waits for each part only where its layers begin (`wait_by_layer`): the first layers compute
while the last ones are still on the bus, and the pass stays one CUDA graph, whose layers wait on
the tier's `part_ready` events (external events, captured as wait nodes; vLLM's KV connectors
wait for a layer's load inside its attention the same way).

Where each move runs, so that neither kind of copy holds up the batch:

- **offload** (an evicted cached block into a slot): the gather runs on the compute stream, in the
  step's order, so the block can be written by its new owner right after; the copies to the host
  run on a low-priority stream and nothing waits for them but a later copy of the same slot;
- **load** (a prefix hit in the tier back into pool blocks): the copies from the host into a
  staging buffer on a high-priority stream (started as soon as the bookkeeping knows the load,
  before it allocates and evicts for it: `fetch_ahead`; a slot an offload of the step writes
  is read again after it), then each part's scatter into the blocks on a stream of its own, as
  soon as that part has crossed and what the compute stream had queued is done (the blocks'
  previous bytes may still be read by an offload's gather). The forward pass that reads them
  waits on the load's events, not on the device: the same step's when the request runs alone,
  else the next one's (beside other requests it waits a step, so that their passes never wait
  for it).

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

TIER_PARTS = 4  # at most: the parts of the layers a load brings back one after the other
_SLOT = itemgetter(1)
Parts = tuple[tuple[Any, ...], ...]  # per part, the events its bytes wait for


def tier_parts(page_layers: int) -> int:
    """How many equal parts of its layers a slot is laid out in (TIER_PARTS where they divide)."""
    return next(p for p in (TIER_PARTS, 2, 1) if page_layers % p == 0)


class TierCopies:
    """The tier's host memory and the copies in and out of the pool `kv_cache`."""

    def __init__(self, kv_cache: torch.Tensor, num_slots: int) -> None:
        layers, rest = kv_cache.shape[0], kv_cache.shape[1:2] + kv_cache.shape[3:]
        self.num_parts = tier_parts(layers)
        self.part_layers = layers // self.num_parts
        self.device = kv_cache.device
        cuda = self.device.type == "cuda"
        self.store = torch.zeros((self.num_parts, num_slots, self.part_layers, *rest),
                                 dtype=kv_cache.dtype, pin_memory=cuda)
        self.num_slots = num_slots
        self.slot_bytes = self.store[:, 0].numel() * self.store.element_size() if num_slots else 0
        # copies over the bus and their bytes, each way: a prefix's blocks in consecutive slots
        # go in one copy a part (the benchmarks report the bytes a copy moves)
        self.bus_copies = {"out": 0, "in": 0}
        self.bus_bytes = {"out": 0, "in": 0}
        self._slot_event: dict[int, Any] = {}  # a slot's last copy, for the next one to wait on
        self._block_event: dict[int, Any] = {}  # a loaded block: its forward waits on this
        self._parts_of: dict[Any, tuple[Any, ...]] = {}  # a load's last event: each part's
        self._scattered: Any = None  # the last load's scatter: its buffers' next writer waits
        self._staged: torch.Tensor | None = None  # the loads' staging buffer, see _staging
        self._ahead_buf: torch.Tensor | None = None  # where `fetch_ahead` copies to
        self._ahead_rows = 0  # its rows in use (fetched and not yet loaded)
        self._ahead: dict[int, tuple[torch.Tensor, int, Parts]] = {}  # slot: (buffer, row, parts)
        # a forward pass's layers wait on these (`wait_by_layer`); each recorded once now, as a
        # CUDA graph captures a wait only on an event that exists
        self.part_ready: tuple[Any, ...] = ()
        if cuda and num_slots:
            low, high = torch.cuda.Stream.priority_range()
            self._offload_stream = torch.cuda.Stream(self.device, priority=low)
            self._load_stream = torch.cuda.Stream(self.device, priority=high)
            self._scatter_stream = torch.cuda.Stream(self.device, priority=high)
            self._ready_stream = torch.cuda.Stream(self.device, priority=high)
            try:
                self.part_ready = tuple(torch.cuda.Event(external=True)
                                        for _ in range(self.num_parts))
            except TypeError:  # a torch without external events: passes wait for loads whole
                self.part_ready = ()
            for event in self.part_ready:
                event.record()

    # ---- the two copies ----------------------------------------------------------------------

    @torch.inference_mode()
    def offload(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Pool block -> tier slot for every (block, slot)."""
        blocks, slots = _ids(sorted(pairs, key=_SLOT))  # by slot: runs go in one copy a part
        staged = _gather(kv_cache, blocks, self.num_parts)  # on the compute stream: the block
        if self.device.type != "cuda":  # is free after it
            for part, rows in enumerate(staged):
                self.store[part, slots] = rows
            return
        gathered = torch.cuda.Event()
        gathered.record()
        with torch.cuda.stream(self._offload_stream):
            self._offload_stream.wait_event(gathered)
            self._wait_slots(self._offload_stream, slots)
            for first, last, at in self._count(slots, "out"):
                for part, rows in enumerate(staged):
                    self.store[part, first:last].copy_(rows[at:at + last - first],
                                                       non_blocking=True)
            for rows in staged:  # not reused before this stream read them
                rows.record_stream(self._offload_stream)
            done = torch.cuda.Event()
            done.record()
        self._slot_event.update(dict.fromkeys(slots, done))
        if self._ahead:  # fetched bytes of a slot written since are not its bytes
            for s in slots:
                self._ahead.pop(s, None)

    @torch.inference_mode()
    def load(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Tier slot -> pool block for every (slot, block)."""
        slots, blocks = _ids(sorted(pairs))  # by slot: runs of consecutive slots, one copy a part
        if self.device.type != "cuda":
            _scatter(kv_cache, to_device(blocks, torch.long, self.device), self.store[:, slots])
            return
        queued = torch.cuda.Event()
        queued.record()  # whatever the compute stream still does with these blocks
        fetched = self._fetched(slots)
        if fetched is None:
            fetched = self._bus_in(slots, self._staging(len(slots)), 0)
        staged, parts = fetched
        # each part's scatter as soon as its bytes have crossed and the compute stream's queue
        # is done (an offload's gather of these very blocks, their old bytes, may be in it)
        scatter = self._scatter_stream
        with torch.cuda.stream(scatter):
            scatter.wait_event(queued)
            idx = to_device(blocks, torch.long, self.device)
            done = []
            for part, waits in enumerate(parts):
                for event in waits:
                    scatter.wait_event(event)
                _scatter(kv_cache, idx, staged[part:part + 1], part, self.num_parts)
                done.append(torch.cuda.Event())
                done[-1].record()
            staged.record_stream(scatter)  # a replaced buffer is not reused before this read it
        last = self._scattered = done[-1]
        self._parts_of[last] = tuple(done)
        self._slot_event.update(dict.fromkeys(slots, last))
        self._block_event.update(dict.fromkeys(blocks, last))

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
            self._ahead_rows = 0  # every row loaded: the buffer is free once their scatters are
        at = self._ahead_rows
        buf = self._ahead_buf
        if buf is None or buf.shape[1] < at + len(ordered):
            # a new buffer for these rows; fetched rows not yet loaded keep the old one
            size = max(len(ordered), 0 if buf is None else buf.shape[1])
            with torch.cuda.stream(self._load_stream):  # its memory follows this stream
                buf = self._ahead_buf = torch.empty((self.num_parts, size, *self.store.shape[2:]),
                                                    dtype=self.store.dtype, device=self.device)
            at = 0
        _, parts = self._bus_in(ordered, buf, at)
        for i, s in enumerate(ordered):
            self._slot_event[s] = parts[-1][0]  # an offload into it waits until the bus read it
            self._ahead[s] = (buf, at + i, parts)
        self._ahead_rows = at + len(ordered)

    def _bus_in(self, slots: list[int], buf: torch.Tensor, at: int) -> tuple[torch.Tensor, Parts]:
        """The bus copies of these slots into rows `at`... of `buf`, part after part, on the load
        stream: (the rows, per part the event its bytes are there)."""
        stream = self._load_stream
        events = []
        with torch.cuda.stream(stream):
            self._wait_slots(stream, slots)
            if self._scattered is not None:  # the buffer's rows may still be scattered from
                stream.wait_event(self._scattered)
            runs = self._count(slots, "in")
            for part in range(self.num_parts):
                for first, last, i in runs:
                    buf[part, at + i:at + i + last - first].copy_(self.store[part, first:last],
                                                                  non_blocking=True)
                events.append((torch.cuda.Event(),))
                events[-1][0].record()
        return buf[:, at:at + len(slots)], tuple(events)

    def _fetched(self, slots: list[int]) -> tuple[torch.Tensor, Parts] | None:
        """These slots' bytes from the copies `fetch_ahead` started, with the events of their
        parts, or None when it did not fetch them all (this load reads them all from the host:
        the rows it fetched are let go)."""
        rows = [self._ahead.pop(s, None) for s in slots]  # each fetched once: its load takes it
        if None in rows:
            return None
        buf, first, _ = rows[0]
        fetches = list(dict.fromkeys(parts for _, _, parts in rows))  # usually one
        if all(b is buf and r == first + i for i, (b, r, _) in enumerate(rows)):
            return buf[:, first:first + len(rows)], tuple(
                tuple(e for parts in fetches for e in parts[p]) for p in range(self.num_parts))
        with torch.cuda.stream(self._load_stream):  # after the fetches, in stream order
            rows_of = torch.stack([b[:, r] for b, r, _ in rows], dim=1)
            gathered = torch.cuda.Event()
            gathered.record()
        return rows_of, ((gathered,),) * self.num_parts

    # ---- what a forward pass waits for ----------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether a load's blocks have not been waited for yet."""
        return bool(self._block_event)

    def wait_for_blocks(self, blocks: Collection[int]) -> None:
        """The compute stream waits (on the device) for the whole loads of these blocks, if any:
        once a load. The loads in flight are few blocks, a step's tables many (a load step's 32
        decoders read ~1,300): the pending ones are looked up in the step's, not the other way."""
        stream = torch.cuda.current_stream(self.device)
        for event in take_loads(self._block_event, blocks):
            self._parts_of.pop(event, None)
            stream.wait_event(event)

    def wait_by_layer(self, blocks: Collection[int]) -> list[Any]:
        """Before a forward pass that reads these blocks, whose layers wait on `part_ready`:
        each part's event now stands for that part of every load of them (the pass's first
        layers start while the last parts cross). Returns the loads' last events, for the
        compute stream to wait on after the pass is launched (`after_pass`), so that nothing
        later reads a block before its load is whole.

        Recording the events again while graphs launched earlier still sit in the queue is safe:
        a replay waits for an event's record made before its launch, not a later one (a GPU
        test holds that: tests/engine/runtime/test_graph_event_waits.py); a later one could make
        such a graph wait for a load that itself waits for that graph's stream."""
        loads = take_loads(self._block_event, blocks)
        if not loads:
            return []
        stream = self._ready_stream
        with torch.cuda.stream(stream):
            for part, ready in enumerate(self.part_ready):
                for load in loads:
                    stream.wait_event(self._parts_of[load][part])
                ready.record()
        for load in loads:
            del self._parts_of[load]
        return loads

    def after_pass(self, loads: list[Any]) -> None:
        """After a pass that waited layer by layer (`wait_by_layer`): the compute stream waits
        for those loads whole, behind the pass."""
        stream = torch.cuda.current_stream(self.device)
        for event in loads:
            stream.wait_event(event)

    def read(self, slot: int) -> torch.Tensor:
        """A slot's bytes, [page_layers, 2, bs, heads, dim] (a copy), once its copies are done."""
        event = self._slot_event.get(slot)
        if event is not None:
            event.synchronize()
        parts = self.store[:, slot]
        return parts.reshape(parts.shape[0] * parts.shape[1], *parts.shape[2:])

    # ---- internals -----------------------------------------------------------------------------

    def _count(self, slots: list[int], way: str) -> list[tuple[int, int, int]]:
        """The runs of consecutive slots, one copy a part each, counted with their bytes."""
        runs = _runs(slots)
        self.bus_copies[way] += len(runs) * self.num_parts
        self.bus_bytes[way] += len(slots) * self.slot_bytes
        return runs

    def _staging(self, n: int) -> torch.Tensor:
        """The loads' staging buffer, at least n slots' worth, kept for the engine's life (grown
        when a load is larger) rather than taken from the caching allocator at every load, where
        a pool with no free block of the size takes new device memory, which synchronises. A
        load's copy into it waits for the last load's scatter out of it (`_bus_in`)."""
        if self._staged is None or self._staged.shape[1] < n:
            with torch.cuda.stream(self._load_stream):
                self._staged = torch.empty(
                    (self.num_parts, max(n, TIER_LOAD_CHUNK), *self.store.shape[2:]),
                    dtype=self.store.dtype, device=self.device)
        return self._staged

    def _wait_slots(self, stream: Any, slots: list[int]) -> None:
        # each slot's last copy once (a prefix's slots share one), looked up in C: a copy's host
        # part is paid before its bus time starts
        for event in dict.fromkeys(map(self._slot_event.get, slots)):
            if event is not None:
                stream.wait_event(event)


def layer_waits(tier: TierCopies, layer_slot: tuple[int, ...]) -> tuple[tuple[Any, ...], ...] | None:
    """Per model layer, the tier's `part_ready` events it waits on before it reads the pool:
    the first layer of each part its own (`layer_slot`: each layer's slot of the pool's pages),
    the others none. None where no pass ever waits layer by layer (a CPU, no tier)."""
    if not tier.part_ready:
        return None
    seen: set[int] = set()
    waits = []
    for slot in layer_slot:
        part = slot // tier.part_layers
        waits.append(() if part in seen else (tier.part_ready[part],))
        seen.add(part)
    return tuple(waits)


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


def _by_part(kv_cache: torch.Tensor, parts: int) -> torch.Tensor:
    """The pool as [parts, part_layers, 2, blocks, bs, heads, dim] (a view)."""
    return kv_cache.view(parts, kv_cache.shape[0] // parts, *kv_cache.shape[1:])


def _gather(kv_cache: torch.Tensor, blocks: list[int], parts: int) -> list[torch.Tensor]:
    """For each part of the layers, [n, part_layers, 2, bs, heads, dim]: the blocks' pieces,
    contiguous, in one pass a part (an index of the part's block-major view on its first
    dimension: `index_select` then a contiguous copy read and wrote the bytes twice, 2.3x
    slower on the 2-core CPU for 100 blocks of a 1B shape; one index of the whole pool on its
    second dimension, 1.7x)."""
    idx = to_device(blocks, torch.long, kv_cache.device)
    return [part.permute(2, 0, 1, 3, 4, 5)[idx] for part in _by_part(kv_cache, parts)]


def _scatter(kv_cache: torch.Tensor, idx: torch.Tensor, staged: torch.Tensor, first: int = 0,
             parts: int | None = None) -> None:
    """Write `staged` [k, n, part_layers, ...] (k parts from part `first` on) into the blocks
    `idx` of the pool; `parts`: the pool's parts (default: k, the whole pool)."""
    pool = _by_part(kv_cache, parts or staged.shape[0])[first:first + staged.shape[0]]
    pool.index_copy_(3, idx, staged.permute(0, 2, 3, 1, 4, 5, 6))


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
