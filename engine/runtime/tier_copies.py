"""The CPU tier's bytes at the speed of the bus: contiguous slots in pinned host memory, copied by
the DMA engines on streams of their own.

The pool lays a block out by layer (`kv_cache[layer, k/v, block, ...]`, the layout the attention
kernels read), so one block's K/V are 2 x layers pieces of a few KB each; copied piece by piece
over PCIe they reach a few GB/s. The tier lays a slot out by block instead, in a few parts of
consecutive layers (`parts`: 4 of 4 layers for a Llama-3.2-1B shape, 128 KB a block and part),

    tier[part, slot, layers of the part, 2, block_size, kv_heads, head_dim]

so that a run of consecutive slots is one contiguous run of bytes in each part. A copy goes in
two moves: on the device, a gather of the blocks' pieces into a contiguous staging buffer (or a
scatter out of one: device memory is fast), and over the bus one `cudaMemcpyAsync` per run of
consecutive slots and part, from or into pinned memory (the DMA engines, not the SMs).

Where each move runs, so that neither kind of copy holds up the batch:

- **offload** (an evicted cached block into a slot): the gather runs on the compute stream, in the
  step's order, so the block can be written by its new owner right after; the copy to the host
  runs on a low-priority stream and nothing waits for it but a later copy of the same slot;
- **load** (a prefix hit in the tier back into pool blocks): on a high-priority stream, the copy
  from the host into a staging buffer, part after part (started as soon as the bookkeeping
  knows the load, before it allocates and evicts for it: `fetch_ahead`; a slot an offload of
  the step writes is read again after it), then on a second high-priority stream, after what
  the compute stream had queued (the blocks' previous bytes may still be read by an offload's
  gather), the scatter of each part into the blocks as soon as its bytes are over the bus.
  The forward pass that reads them waits for the load on the device (the host never waits):
  the next step's beside other requests (so that their passes never wait for the bus), the
  same step's when the request runs alone, and then layer part by layer part
  (`wait_for_blocks(by_layer=True)`).

Waiting by layer part inside a CUDA graph: the decoder waits, before the first layer of each
part, on one of `layer_events`, events made with `external=True` so that a captured wait is a
wait node of the graph (vLLM's KV connectors wait for a layer's load inside its attention op, as
well). A pass that waits by part sets event p to the scatter of part p of every load it reads;
any other pass finds the events long complete and goes through at no cost. The events are set
again only once the last pass launched has run (`after_pass`): a graph's wait node might read
its event as it runs rather than as it is launched. So the rest of a long prompt computes its
first layers while the bus still brings the last ones (run 21 tried the same overlap through
the eager path, whose launches cost more than it saved; run 54 measured this one).

Every copy of a slot waits for the one before it of that slot (an offload into a slot a load is
still reading, a load of a slot an offload is still writing). On a CPU both moves are plain copies.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from operator import itemgetter
from typing import Any

import torch

from engine.core.scheduler import TIER_LOAD_CHUNK  # a load beside decodes: a step's blocks
from engine.runtime.transfer import to_device

_SLOT = itemgetter(1)


def tier_parts(page_layers: int) -> int:
    """How many layer parts a slot is cut into: `PAGEDLAB_TIER_PARTS` (1: whole slots, no
    waits by part), else the largest of 4, 3, 2, 1 that divides the layers (a part is a few
    MB of a long prefix's load: enough to keep the bus at its speed)."""
    wanted = os.environ.get("PAGEDLAB_TIER_PARTS", "")
    if wanted:
        parts = int(wanted)
        if parts < 1 or page_layers % parts:
            raise ValueError(f"PAGEDLAB_TIER_PARTS={wanted} must be >= 1 and divide the model's "
                             f"{page_layers} layers")
        return parts
    return next(p for p in (4, 3, 2, 1) if page_layers % p == 0)


class TierCopies:
    """The tier's host memory and the copies in and out of the pool `kv_cache`."""

    def __init__(self, kv_cache: torch.Tensor, num_slots: int) -> None:
        layers, piece = kv_cache.shape[0], tuple(kv_cache.shape[3:])
        self.device = kv_cache.device
        cuda = self.device.type == "cuda"
        self.parts = tier_parts(layers)
        self.part_layers = layers // self.parts
        # [part, slot, layers of the part, 2, bs, heads, dim]
        self.slots = torch.zeros((self.parts, num_slots, self.part_layers, 2, *piece),
                                 dtype=kv_cache.dtype, pin_memory=cuda)
        self.num_slots = num_slots
        self.slot_bytes = self.slots[:, 0].numel() * self.slots.element_size() if num_slots else 0
        # copies over the bus and their bytes, each way: a prefix's blocks in consecutive slots
        # go in one copy a part (the benchmarks report the bytes a copy moves)
        self.bus_copies = {"out": 0, "in": 0}
        self.bus_bytes = {"out": 0, "in": 0}
        self._slot_event: dict[int, Any] = {}  # a slot's last copy, for the next one to wait on
        self._block_event: dict[int, Any] = {}  # a loaded block: its forward waits on this
        self._staged: torch.Tensor | None = None  # the loads' staging buffer, see _staging
        self._ahead_buf: torch.Tensor | None = None  # where `fetch_ahead` copies to
        self._ahead_rows = 0  # its rows in use (fetched and not yet loaded)
        # a fetched slot: (buffer, row, (which fetch, its event per part))
        self._ahead: dict[int, tuple[torch.Tensor, int, tuple[int, list]]] = {}
        self._fetches = 0
        self._scattered: Any = None  # the last load's scatter: buffers it reads are free after it
        self._parts: dict[Any, list] = {}  # a load in flight (its event): its scatter's part events
        self._last_pass: Any = None  # the compute stream after the last forward pass
        self.layer_events: list[Any] = []
        if cuda:
            low, high = torch.cuda.Stream.priority_range()
            self._offload_stream = torch.cuda.Stream(self.device, priority=low)
            self._load_stream = torch.cuda.Stream(self.device, priority=high)
            self._scatter_stream = torch.cuda.Stream(self.device, priority=high)
            self._signal_stream = torch.cuda.Stream(self.device, priority=high)
            if num_slots and self.parts > 1:
                self.layer_events = [torch.cuda.Event(external=True) for _ in range(self.parts)]
                for event in self.layer_events:  # made now (lazily else): a capture must see them
                    event.record()

    def layer_waits(self, layer_slot: list[int]) -> tuple[Any, ...] | None:
        """For each layer, the event the decoder waits on before it (the first layer of each
        part: `layer_slot` maps a layer to its place in the pool), else None; None when no pass
        waits by part (no tier, whole slots, a CPU)."""
        if not self.layer_events:
            return None
        return tuple(self.layer_events[s // self.part_layers] if s % self.part_layers == 0
                     else None for s in layer_slot)

    # ---- the two copies ----------------------------------------------------------------------

    @torch.inference_mode()
    def offload(self, kv_cache: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
        """Pool block -> tier slot for every (block, slot)."""
        blocks, slots = _ids(sorted(pairs, key=_SLOT))  # by slot: runs go in one copy
        staged = _gather(kv_cache, blocks, self.parts)  # compute stream: the block is free after
        if self.device.type != "cuda":
            self.slots[:, slots] = staged
            return
        gathered = torch.cuda.Event()
        gathered.record()
        with torch.cuda.stream(self._offload_stream):
            self._offload_stream.wait_event(gathered)
            self._wait_slots(self._offload_stream, slots)
            runs = self._count(slots, "out")
            for part in range(self.parts):
                for first, last, at in runs:
                    self.slots[part, first:last].copy_(staged[part, at:at + last - first],
                                                       non_blocking=True)
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
            _scatter(kv_cache, blocks, self.slots[:, slots], range(self.parts))
            return
        queued = torch.cuda.Event()
        queued.record()  # whatever the compute stream still does with these blocks
        with torch.cuda.stream(self._load_stream):
            staged, fetched = self._fetched(slots)
            if staged is None:
                self._wait_slots(self._load_stream, slots)
                staged = self._staging(len(slots))
                fetched = self._bus_in(staged, 0, slots)
        with torch.cuda.stream(self._scatter_stream):
            # the scatter, not the bus copy, waits for the compute stream: the copy into staging
            # overlaps an offload's gather of these very blocks (their old bytes) still queued
            self._scatter_stream.wait_event(queued)
            staged.record_stream(self._scatter_stream)
            idx = to_device(blocks, torch.long, self.device)
            scattered = []
            for part, bus_done in enumerate(fetched):
                self._scatter_stream.wait_event(bus_done)  # this part over the bus: scatter it
                _scatter(kv_cache, idx, staged[part:part + 1], (part,))
                scattered.append(torch.cuda.Event())
                scattered[-1].record()
        done = self._scattered = scattered[-1]
        self._parts[done] = scattered
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
            self._ahead_rows = 0  # every row loaded: free again once scattered (`_bus_in` waits)
        with torch.cuda.stream(self._load_stream):  # the buffer's memory follows this stream
            at = self._ahead_rows
            if self._ahead_buf is None or self._ahead_buf.shape[1] < at + len(ordered):
                # a new buffer for these rows; fetched rows not yet loaded keep the old one
                size = max(len(ordered), 0 if self._ahead_buf is None else self._ahead_buf.shape[1])
                self._ahead_buf = torch.empty((self.parts, size, *self.slots.shape[2:]),
                                              dtype=self.slots.dtype, device=self.device)
                at = 0
            self._wait_slots(self._load_stream, ordered)
            buf = self._ahead_buf
            fetched = self._bus_in(buf, at, ordered)
        self._fetches += 1
        for i, s in enumerate(ordered):
            self._slot_event[s] = fetched[-1]  # an offload into it waits until the bus read it
            self._ahead[s] = (buf, at + i, (self._fetches, fetched))
        self._ahead_rows = at + len(ordered)

    def _bus_in(self, buf: torch.Tensor, at: int, slots: list[int]) -> list[Any]:
        """On the load stream: these slots over the bus into rows `at`... of `buf`, part after
        part, once the last load's scatter has read what the rows held; an event per part."""
        if self._scattered is not None:
            self._load_stream.wait_event(self._scattered)
        runs, events = self._count(slots, "in"), []
        for part in range(self.parts):
            for first, last, i in runs:
                buf[part, at + i:at + i + last - first].copy_(self.slots[part, first:last],
                                                              non_blocking=True)
            events.append(torch.cuda.Event())
            events[-1].record()
        return events

    def _fetched(self, slots: list[int]) -> tuple[torch.Tensor | None, list[Any]]:
        """These slots' bytes from the copies `fetch_ahead` started, with the part events of
        the latest fetch among them (one stream: its part p comes after all of every earlier
        fetch), or None when it did not fetch them all (this load reads them all from the
        host: the rows it fetched are let go)."""
        rows = [self._ahead.pop(s, None) for s in slots]  # each fetched once: its load takes it
        if None in rows:
            return None, []
        events = max(r[2] for r in rows)[1]
        buf, first, _ = rows[0]
        if all(b is buf and r == first + i for i, (b, r, _) in enumerate(rows)):
            return buf[:, first:first + len(rows)], events
        return torch.stack([b[:, r] for b, r, _ in rows], dim=1), events

    @property
    def pending(self) -> bool:
        """Whether a load's blocks have not been waited for yet."""
        return bool(self._block_event)

    def wait_for_blocks(self, blocks: Collection[int], by_layer: bool = False) -> None:
        """The compute stream waits (on the device) for the loads of these blocks, if any: once
        a load. The loads in flight are few blocks, a step's tables many (a load step's 32
        decoders read ~1,300): the pending ones are looked up in the step's, not the other way.
        `by_layer`: the pass that follows waits on `layer_events` before each part's layers, so
        it waits there instead, part by part: layer event p is set to every one of these loads'
        scatter of part p. Only while no earlier pass may still wait on those events; else the
        pass waits for the loads whole, first."""
        events = take_loads(self._block_event, blocks)
        parts = [self._parts.pop(e) for e in events]
        if by_layer and events and self.layer_events and \
                (self._last_pass is None or self._last_pass.query()):
            with torch.cuda.stream(self._signal_stream):
                for part, layer_event in enumerate(self.layer_events):
                    for scattered in parts:
                        self._signal_stream.wait_event(scattered[part])
                    layer_event.record()
            return
        stream = torch.cuda.current_stream(self.device)
        for event in events:
            stream.wait_event(event)

    def after_pass(self) -> None:
        """A forward pass was launched: `wait_for_blocks` sets the layer events again only once
        it has run (a graph's wait node may read its event when it runs, not when launched)."""
        if self.layer_events:
            self._last_pass = torch.cuda.Event()
            self._last_pass.record()

    def last_copy(self, slot: int) -> Any:
        """The event of this slot's last copy, or None (none yet, or on a CPU): what `read`
        waits for, and what a benchmark times a copy to on the device."""
        return self._slot_event.get(slot)

    def read(self, slot: int) -> torch.Tensor:
        """A slot's bytes, [page_layers, 2, bs, heads, dim], once its copies are done."""
        event = self.last_copy(slot)
        if event is not None:
            event.synchronize()
        return self.slots[:, slot].flatten(0, 1)

    # ---- internals -----------------------------------------------------------------------------

    def _count(self, slots: list[int], way: str) -> list[tuple[int, int, int]]:
        """The runs of consecutive slots, one copy each a part, counted with their bytes."""
        runs = _runs(slots)
        self.bus_copies[way] += len(runs) * self.parts
        self.bus_bytes[way] += len(slots) * self.slot_bytes
        return runs

    def _staging(self, n: int) -> torch.Tensor:
        """n slots' worth of the loads' staging buffer, kept for the engine's life (grown when a
        load is larger) rather than taken from the caching allocator at every load, where a
        pool with no free block of the size takes new device memory, which synchronises.
        A load's copy into it waits for the last load's scatter out of it (`_bus_in`)."""
        if self._staged is None or self._staged.shape[1] < n:
            self._staged = torch.empty((self.parts, max(n, TIER_LOAD_CHUNK), *self.slots.shape[2:]),
                                       dtype=self.slots.dtype, device=self.device)
        return self._staged[:, :n]

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


def _gather(kv_cache: torch.Tensor, blocks: list[int], parts: int) -> torch.Tensor:
    """[parts, n, part layers, 2, bs, heads, dim]: each block's pieces, contiguous in each
    part, in one pass (an index of the block-major view: `index_select` then a contiguous copy
    read and wrote the bytes twice, on the compute stream, before the step's forward pass; 2.3x
    slower on the 2-core CPU for 100 blocks of a 1B shape)."""
    idx = to_device(blocks, torch.long, kv_cache.device)
    by_part = kv_cache.unflatten(0, (parts, -1))  # [parts, part layers, 2, blocks, ...]
    return by_part.permute(0, 3, 1, 2, 4, 5, 6)[:, idx]


def _scatter(kv_cache: torch.Tensor, blocks: list[int] | torch.Tensor, staged: torch.Tensor,
             parts: range | tuple[int, ...]) -> None:
    """Write `staged` [len(parts), n, part layers, 2, bs, heads, dim] into the n blocks, in
    these consecutive layer parts of the pool."""
    idx = blocks if isinstance(blocks, torch.Tensor) else to_device(blocks, torch.long, kv_cache.device)
    per = staged.shape[2]
    span = kv_cache[parts[0] * per:(parts[-1] + 1) * per].unflatten(0, (len(parts), per))
    span.index_copy_(3, idx, staged.permute(0, 2, 3, 1, 4, 5, 6))


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
