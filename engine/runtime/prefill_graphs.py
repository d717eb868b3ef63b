"""Steps with prompt chunks (prefills beside decodes) from static buffers, replayed as CUDA graphs.

A decode step runs as a graph (decode_graphs.py); a step with a chunk of a prompt was launched
kernel by kernel: for a small model that is host-bound. Run 40 (bench/NOTES.md, one H200, 32
prompts of 4,096 tokens, 8,192 tokens a step): the host spent ~11 ms a step launching the
forward pass's ~300 kernels while the device was busy 7.6 ms (the hybrid model) and 9.7 ms (all
layers full) of it, so a cheaper attention could not show.

So such a step runs in a bucket of tokens (multiples of 256 up to the step's token budget): its
tokens first, padding after them (position 0, slot -1: no K/V written; their rows are computed
and never read); its sequences first, padding rows after them (no query, no context). The
attention's grid cannot follow the step inside a graph, so it runs over a tile map: one program
a (sequence, query tile) pair, listed by the host, sized for the bucket's worst case
(paged_kernels/attention_config.py `tile_map`). Logits come back for each sequence's last token.

The host sends the step in one transfer of one pinned int32 buffer (two, used in turn: under async
scheduling step t + 1 is filled while step t's copy may still wait):

    [ ids T | positions T | slots G x T | seq_lens S | query starts S + 1 | last rows S |
      tile map 2 x M | tables G x S x W ]

On a CPU nothing replays: the same function runs eagerly on the padded buffers (the tests hold
it equal to the plain path).
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable

import numpy as np
import torch

from engine.runtime.step_inputs import HostInputs
from paged_kernels.attention_config import tile_map

#: buckets are multiples of this many tokens (of more, where that would make over MAX_BUCKETS):
#: a step computes at most one bucket's step of padding, a few percent of a long chunk
BUCKET_STEP = 256
MAX_BUCKETS = 32


class PrefillGraphs:
    """Static-buffer steps of up to `max_tokens` tokens and `max_seqs` sequences for one
    ModelRunner; CUDA graphs when the device is a GPU. `forward(ids, positions, slots, tables,
    seq_lens, query starts, last rows, tile map, size)` is the runner's decoder + LM head (held
    weakly, as DecodeGraphs holds it)."""

    def __init__(self, forward: Callable[..., torch.Tensor], device: torch.device, max_tokens: int,
                 max_seqs: int, width: int, num_groups: int, query_tile: Callable[[int], int],
                 use_graphs: bool | None = None) -> None:
        self._forward = (weakref.WeakMethod(forward) if inspect.ismethod(forward)
                         else lambda: forward)
        self.device = device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        step = -(-max_tokens // MAX_BUCKETS // BUCKET_STEP) * BUCKET_STEP
        self.sizes = tuple(range(step, max_tokens, step)) + (max_tokens,)
        self.max_seqs, self.width, self.num_groups = max_seqs, width, num_groups
        self.tiles = {t: query_tile(t) for t in self.sizes}  # query tokens a program, by bucket
        t, s, g = max_tokens, max_seqs, num_groups
        m = max(t // self.tiles[size] + s for size in self.sizes)
        names = ("ids", "positions", "slots", "seq_lens", "starts", "last", "map", "tables")
        lengths = (t, t, g * t, s, s + 1, s, 2 * m, g * s * width)
        self._at = dict(zip(names, np.cumsum((0,) + lengths[:-1]).tolist(), strict=True))
        self.map_room = m
        n = sum(lengths)
        pin = device.type == "cuda"
        self._hosts = [torch.zeros(n, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self.buffer = torch.zeros(n, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: torch.Tensor | None = None  # [S, vocab], every graph's output (made once)
        self._pool = None
        # on a GPU only once every bucket is captured (the runner's warm-up): an engine that
        # does not warm up (the app's later sessions, a ZeroGPU call) keeps the eager path
        # rather than capture a graph in the middle of a user's step
        self.ready = not self.use_graphs
        self.num_steps = 0  # steps run from these buffers
        self.num_replays = 0  # of them, replayed graphs

    def close(self) -> None:
        """Let go of the graphs (first: a graph keeps its pool's memory), outputs and buffers."""
        self.graphs.clear()
        self.logits = self._pool = None
        self._hosts, self._copied, self.buffer = [], [None, None], None

    def bucket(self, num_tokens: int, num_seqs: int, table_width: int) -> int | None:
        """The bucket a step of this size runs in, or None when it does not fit."""
        if not self.ready or num_seqs > self.max_seqs or table_width > self.width or not self._hosts:
            return None
        return next((b for b in self.sizes if b >= num_tokens), None)

    @torch.inference_mode()
    def run(self, step: HostInputs, size: int,
            feed: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """The step's logits, one row a sequence (its last token's). `feed(ids)` writes the
        token ids the host does not have yet into the device's int32 ids (async scheduling)."""
        used = self._fill(step, size)
        self.buffer[:used].copy_(self._hosts[self._turn][:used], non_blocking=True)
        if self.use_graphs:
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
        if feed is not None:
            feed(self.buffer[:size])
        n = len(step.seq_lens)
        self.num_steps += 1
        if not self.use_graphs:
            return self._compute(size)[:n].float()
        self.graphs[size].replay()
        self.num_replays += 1
        return self.logits[:n]

    @torch.inference_mode()
    def capture(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Every bucket's graph now, largest first so that the smaller ones reuse its memory."""
        if not self.use_graphs:
            return
        todo = sorted(self.sizes, reverse=True)
        for i, size in enumerate(todo):
            if progress is not None:
                progress(i, len(todo))
            if size not in self.graphs:
                self._capture(size)
        self.ready = True

    # ---- internals ------------------------------------------------------------------------------

    def _fill(self, step: HostInputs, size: int) -> int:
        """The step into the next pinned buffer; returns how much of it to send."""
        self._turn ^= 1
        if self._copied[self._turn] is not None:
            self._copied[self._turn].synchronize()  # its last copy to the device is done
        h, at, top, s = self._hosts[self._turn].numpy(), self._at, self.sizes[-1], self.max_seqs
        t, n = len(step.ids), len(step.seq_lens)
        h[at["ids"]:at["ids"] + size] = 0
        h[at["ids"]:at["ids"] + t] = step.ids
        h[at["positions"]:at["positions"] + size] = 0
        h[at["positions"]:at["positions"] + t] = step.positions
        slots = h[at["slots"]:at["slots"] + self.num_groups * top].reshape(self.num_groups, top)
        slots[:, :size] = -1
        for g, group_slots in enumerate(step.slots):
            slots[g, :t] = group_slots
        h[at["seq_lens"]:at["seq_lens"] + s] = 0
        h[at["seq_lens"]:at["seq_lens"] + n] = step.seq_lens
        h[at["starts"]:at["starts"] + s + 1] = t
        h[at["starts"]:at["starts"] + n + 1] = step.query_start
        h[at["last"]:at["last"] + s] = 0
        h[at["last"]:at["last"] + n] = step.query_start[1:] - 1
        m = self.map_room
        h[at["map"]:at["map"] + 2 * m] = tile_map(np.diff(step.query_start), self.tiles[size],
                                                   m).reshape(-1)
        tables = h[at["tables"]:].reshape(self.num_groups, s, self.width)
        for g, table in enumerate(step.tables):
            tables[g, :n, :table.shape[1]] = table
        return at["tables"] + ((self.num_groups - 1) * s + n) * self.width

    def _compute(self, size: int) -> torch.Tensor:
        """The forward pass on the buffers' first `size` tokens: no host reads (a capture would
        fail on one)."""
        at, buf, top, s, m = self._at, self.buffer, self.sizes[-1], self.max_seqs, self.map_room
        ids = buf[at["ids"]:at["ids"] + size].long()
        positions = buf[at["positions"]:at["positions"] + size].long()
        slots = buf[at["slots"]:at["slots"] + self.num_groups * top].view(
            self.num_groups, top)[:, :size].long()
        seq_lens = buf[at["seq_lens"]:at["seq_lens"] + s]
        starts = buf[at["starts"]:at["starts"] + s + 1]
        last = buf[at["last"]:at["last"] + s].long()
        tiles = size // self.tiles[size] + s
        entries = buf[at["map"]:at["map"] + 2 * m].view(2, m)[:, :tiles]
        tables = buf[at["tables"]:].view(self.num_groups, s, self.width)
        forward = self._forward()
        if forward is None:
            raise RuntimeError("the model runner these prefill graphs belong to is gone")
        return forward(ids, positions, slots, tables, seq_lens, starts, last, entries, size)

    def _capture(self, size: int) -> None:
        # Padding only while warming and capturing: the kernels compile, cuBLAS picks its
        # algorithms, and nothing is written to the pool (every slot -1).
        empty = HostInputs(np.zeros(0, np.int64), np.zeros(0, np.int64),
                              [np.zeros(0, np.int64)] * self.num_groups,
                              [np.zeros((0, 0), np.int32)] * self.num_groups,
                              np.zeros(0, np.int64), np.zeros(1, np.int64))
        used = self._fill(empty, size)
        self.buffer[:used].copy_(self._hosts[self._turn][:used])
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            logits = self._compute(size)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.logits is None:  # one output for every bucket: a bucket's own would cost
            self.logits = torch.empty_like(logits, dtype=torch.float32)  # S x vocab each
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.logits.copy_(self._compute(size))
        self.graphs[size] = graph
