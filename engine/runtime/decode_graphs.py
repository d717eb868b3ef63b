"""Decode steps from static buffers, replayed as CUDA graphs: the engine's hot loop.

A decode step of a small model is several hundred small kernels (30 layers of norms, projections,
RoPE, our paged attention, MLP). Launched one by one from Python, the launches cost far more than
the bytes they move. So a pure-decode step runs from *static* buffers: on a GPU its whole forward
pass, LM head and greedy choice included, is captured once per batch-size bucket as a CUDA graph
and then replayed with one call.

What the host does per step is one pass over the batch: it writes every sequence's token,
position, slot, length and block table into one pinned int32 buffer, copies that buffer to the
device in one transfer, replays the graph of the smallest bucket that holds the batch, and reads
back the greedy tokens and their log probabilities in one transfer. Rows past the batch are
padding: slot -1 (nothing is written) and length 1 (a harmless read of the first block).

Buffer layout (int32), for a capacity of B sequences with block tables W blocks wide, and G KV
cache groups (one for most models; a hybrid model's groups each have their slots and tables):

    [ tokens B | positions B | seq_lens B | slots G x B | block_tables G x B x W ]

On the CPU there is nothing to replay: the same function runs eagerly on the exact batch
(no padding), so the tests exercise the buffer layout and the forward pass the graphs capture;
there it returns the logits alone and the sampler makes the greedy choice only for a step with
a greedy row (a sampled step has no use for it).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

from engine.runtime.row_reductions import greedy_pair

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


class DecodeOutputs:
    """The static outputs of one bucket: float32 logits and, on a GPU, the greedy choice (ids
    and log probs). No log probabilities over the vocabulary: the sampler computes them only
    for a step that needs them (beam search), and on a CPU the greedy choice too."""

    def __init__(self, logits: torch.Tensor, logprobs: torch.Tensor | None = None,
                 greedy_ids: torch.Tensor | None = None,
                 greedy_logprobs: torch.Tensor | None = None) -> None:
        self.logits, self.logprobs = logits, logprobs
        self.greedy_ids, self.greedy_logprobs = greedy_ids, greedy_logprobs

    def rows(self, n: int) -> DecodeOutputs:
        def head(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:n]

        return DecodeOutputs(self.logits[:n], head(self.logprobs), head(self.greedy_ids),
                             head(self.greedy_logprobs))


class DecodeGraphs:
    """Static-buffer decode for one ModelRunner; CUDA graphs when the device is a GPU.

    `forward(ids, positions, slots, seq_lens, tables, max_seq_len)` is the runner's
    decoder + LM head on tensors of B rows (slots [groups, B], tables [groups, B, W]),
    returning [B, vocab] logits. A bound method is held
    weakly: the runner owns these graphs, and a reference back to it would make a cycle that
    keeps the runner, and the KV pool it reads, alive until a garbage collection.
    `close()` drops the graphs, their memory pool and the buffers at once.
    """

    def __init__(self, forward: Callable[..., torch.Tensor], device: torch.device,
                 max_batch: int, max_blocks_per_seq: int, max_seq_len: int,
                 use_graphs: bool | None = None, pad: bool | None = None,
                 num_groups: int = 1) -> None:
        self._forward: Callable[[], Callable[..., torch.Tensor] | None] = (
            weakref.WeakMethod(forward) if inspect.ismethod(forward) else lambda: forward)
        self.device = device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.pad = self.use_graphs if pad is None else pad  # round batches up to the buckets
        self.sizes = tuple(b for b in GRAPH_BATCH_SIZES if b < max_batch) + (max_batch,)
        self.max_batch = max_batch
        self.width = max_blocks_per_seq
        # The kernel's split-K grid is fixed at capture: size it for the longest context.
        self.max_seq_len = max_seq_len
        self.num_groups = num_groups
        self._tables_at = (3 + num_groups) * max_batch  # where the block tables start
        n = self._tables_at + num_groups * max_batch * max_blocks_per_seq
        pin = device.type == "cuda"
        # Two pinned buffers, used in turn: under async scheduling the host fills step t + 1's
        # while step t's copy may still wait in the stream (each records when its copy is done)
        self._hosts = [torch.zeros(n, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._copied: list[Any] = [None, None]
        self._turn = 0
        self.host = self._hosts[0]
        self._host_np = self.host.numpy()
        self.buffer = torch.zeros(n, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, DecodeOutputs] = {}
        self._pool: Any = None
        self.num_replays = 0
        self.closed = False

    def close(self) -> None:
        """Let go of every graph, its outputs and memory pool, and the buffers (idempotent).
        Graphs first: a captured graph keeps its pool's memory until it is destroyed."""
        self.graphs.clear()
        self.outputs.clear()
        self._pool = None
        self._copied = [None, None]
        self._hosts, self.host, self._host_np = [], None, None
        self.buffer = None
        self.closed = True

    # ---- public -------------------------------------------------------------------------------

    def fits(self, num_seqs: int, table_width: int) -> bool:
        return num_seqs <= self.max_batch and table_width <= self.width

    def bucket(self, num_seqs: int) -> int:
        if not self.pad:
            return num_seqs
        return next(b for b in self.sizes if b >= num_seqs)

    @torch.inference_mode()
    def run(self, token_ids: list[int], positions: list[int], slots: list[int],
            tables: list[list[int]], num_blocks: int | None = None,
            feed: Callable[[torch.Tensor], None] | None = None,
            starts: list[int] | None = None) -> DecodeOutputs | None:
        """One decode step for len(token_ids) sequences (position p's token goes to slot s).
        `slots` and `tables` hold every KV cache group's, group after group (n each); with
        `starts`, table k is written from column starts[k] on (a sliding window's tail: the
        columns before it are never read, so they keep whatever valid ids they held).
        With `num_blocks`, the tables are checked to name blocks of the pool (in one pass over
        the buffer); None comes back, and nothing runs, when one does not. `feed(ids)` writes
        token ids the host does not have yet into the device's ids (async scheduling)."""
        n = len(token_ids)
        size = self.bucket(n)
        self._next_host()
        starts = starts or [0] * len(tables)
        used = self._fill(token_ids, positions, slots, tables, size, starts)
        if num_blocks is not None:
            widest = max(s + len(t) for s, t in zip(starts, tables, strict=True))
            b, w = self.max_batch, self.width
            region = self._host_np[self._tables_at:self._tables_at + self.num_groups * b * w]
            region = region.reshape(self.num_groups, b, w)[:, :n, :widest]
            if region.min() < 0 or region.max() >= num_blocks:
                region[:] = 0  # no bad id stays behind for a later step's check to trip on
                return None
        self.buffer[:used].copy_(self.host[:used], non_blocking=True)
        if self.use_graphs:
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
        if feed is not None:
            feed(self.buffer[:n])
        if not self.use_graphs:
            return self._compute(size).rows(n)
        if size not in self.graphs:
            self._capture(size)
        self.graphs[size].replay()
        self.num_replays += 1
        return self.outputs[size].rows(n)

    @torch.inference_mode()
    def capture(self, sizes: tuple[int, ...] | None = None,
                progress: Callable[[int, int], None] | None = None) -> None:
        """Capture the graphs of these buckets now (default: all), largest first so that the
        smaller ones reuse its memory pool. Otherwise each is captured at its first use.
        `progress(done, total)` is called after each one."""
        if not self.use_graphs:
            return
        todo = sorted(sizes or self.sizes, reverse=True)
        for i, size in enumerate(todo):
            if progress is not None:
                progress(i, len(todo))
            if size not in self.graphs:
                groups = self.num_groups
                self._fill([0] * size, [0] * size, [-1] * size * groups, [[0]] * size * groups, size,
                           [0] * size * groups)
                self.buffer.copy_(self.host)
                self._capture(size)

    # ---- internals ------------------------------------------------------------------------------

    def _next_host(self) -> None:
        """Switch to the other pinned buffer, once its last copy to the device is done."""
        self._turn ^= 1
        if self._copied[self._turn] is not None:
            self._copied[self._turn].synchronize()
        self.host = self._hosts[self._turn]
        self._host_np = self.host.numpy()

    def _fill(self, token_ids: list[int], positions: list[int], slots: list[int],
              tables: list[list[int]], size: int, starts: list[int] | None = None) -> int:
        b, w, h = self.max_batch, self.width, self._host_np
        n = len(token_ids)
        h[0:n] = token_ids
        h[b:b + n] = positions
        h[2 * b:2 * b + n] = [p + 1 for p in positions]
        if size > n:  # padding rows: write nothing, read one slot of whatever block row 0 names
            h[n:size] = 0
            h[b + n:b + size] = 0
            h[2 * b + n:2 * b + size] = 1
        for g in range(self.num_groups):
            at = (3 + g) * b
            h[at:at + n] = slots[g * n:(g + 1) * n]
            h[at + n:at + size] = -1
            base = self._tables_at + g * b * w
            for i, table in enumerate(tables[g * n:(g + 1) * n]):
                at = base + i * w + (starts[g * n + i] if starts else 0)
                h[at:at + len(table)] = table
        # Entries past a table's end are never read (the kernel stops at the sequence's length).
        return self._tables_at + (self.num_groups - 1) * b * w + size * w

    def _views(self, size: int) -> tuple[torch.Tensor, ...]:
        b, w, buf, groups = self.max_batch, self.width, self.buffer, self.num_groups
        return (buf[0:size], buf[b:b + size], buf[3 * b:(3 + groups) * b].view(groups, b)[:, :size],
                buf[2 * b:2 * b + size],
                buf[self._tables_at:].view(groups, b, w)[:, :size])

    def _compute(self, size: int) -> DecodeOutputs:
        ids, pos, slots, lens, tables = self._views(size)
        forward = self._forward()
        if forward is None:
            raise RuntimeError("the model runner these decode graphs belong to is gone")
        logits = forward(ids.long(), pos.long(), slots.long(), lens, tables,
                              self.max_seq_len).float()
        if not self.use_graphs:  # eager: a sampled step has no use for the greedy choice
            return DecodeOutputs(logits)
        # in the graph: a greedy step then reads its tokens back with no kernel of its own
        return DecodeOutputs(logits, None, *greedy_pair(logits))

    def _capture(self, size: int) -> None:
        # Warm up on a side stream first (Triton compiles its kernels, cuBLAS picks its
        # algorithms): nothing of that may happen inside the capture.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._compute(size)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.outputs[size] = self._compute(size)
        self.graphs[size] = graph
