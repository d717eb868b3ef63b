"""Decode and verification steps from static buffers, replayed as CUDA graphs: the hot loop.

A decode step of a small model is several hundred small kernels (30 layers of norms, projections,
RoPE, our paged attention, MLP). Launched one by one from Python, the launches cost far more than
the bytes they move. So a step whose every sequence computes Q tokens (Q = 1: a decode; Q = k + 1:
a pending token and its draft of up to k, verified in one pass) runs from static buffers: on a GPU
its whole forward pass, LM head, greedy choice and the drafts' acceptance included, is captured
once per (batch bucket, Q) as a CUDA graph and then replayed with one call. Shorter drafts are
padded to Q (as vLLM pads them): a padding query writes no K/V and its logits are never read.

The block tables stay on the device between steps (engine/runtime/persistent_batch.py): the host
sends each step's tokens, positions, draft lengths and rows, and the table entries that changed,
in one transfer of one pinned int32 buffer:

    [ tokens B x Q | positions B | drafts B | rows B | fed B | changed entries: index D | block id D ]

Under async scheduling a row's first token may still be on the device, in the step before's
picks: `fed` names, per row, the picks' row it is read from (-1: the token sent is the one).
The picks are copied into a static buffer before the replay and gathered inside the graph, so
the host sends no index tensors of its own for them (run 62: two small pinned copies and four
launches a step, 0.17 ms at 32 sequences and 0.45 at 256, on the H100's host).

On the device, inside the graph, each row's tables are gathered from the persistent tables, and
every query's position, slot and context length computed from them. Rows past the batch are
padding: position -1 (no slot, no write), the all-zero table row. Two pinned buffers are used in
turn: under async scheduling the host fills step t + 1's while step t's copy may still wait.

On the CPU there is nothing to replay: the same function runs eagerly on the exact batch (no
padding), so the tests exercise the layout and the forward pass the graphs capture.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.runtime.persistent_batch import PersistentTables
from engine.runtime.row_reductions import greedy_pair

GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
#: a verification step's cost over a decode step's, per draft token, where none was measured:
#: the 2-core CPU's (SmolLM2, k = 4: 44 ms a step against 37 ms, bench/results/speculative_cpu.json)
DEFAULT_VERIFY_COST = 0.05


class DecodeOutputs:
    """The static outputs of one graph: float32 logits [B x Q, vocab] and, on a GPU, the greedy
    choice (ids and log probs) and, for Q > 1, how many of each row's draft tokens the greedy
    choices confirm (`accepted` [B])."""

    def __init__(self, logits: torch.Tensor, greedy_ids: torch.Tensor | None = None,
                 greedy_logprobs: torch.Tensor | None = None,
                 accepted: torch.Tensor | None = None) -> None:
        self.logits, self.greedy_ids, self.greedy_logprobs = logits, greedy_ids, greedy_logprobs
        self.accepted = accepted

    def rows(self, n: int, q: int) -> DecodeOutputs:
        def head(t: torch.Tensor | None, m: int) -> torch.Tensor | None:
            return None if t is None else t[:m]

        return DecodeOutputs(self.logits[:n * q], head(self.greedy_ids, n * q),
                             head(self.greedy_logprobs, n * q), head(self.accepted, n))


class DecodeStep:
    """What the runner hands over for one step of n sequences of q tokens each."""

    __slots__ = ("tokens", "positions", "drafts", "keys", "tables", "q", "fed")

    def __init__(self, tokens: list[int], positions: list[int], drafts: list[int],
                 keys: list[Any], tables: list[list[list[int | None]]], q: int,
                 fed: list[int] | None = None) -> None:
        self.tokens = tokens  # n x q, row after row (a draft padded with zeros)
        self.positions = positions  # each row's first new token's position
        self.drafts = drafts  # each row's draft length (q - 1 at most; 0 for a decode)
        self.keys = keys  # each row's sequence (the persistent batch keeps its tables)
        self.tables = tables  # tables[g][i]: KV cache group g's table of row i
        self.q = q
        self.fed = fed  # each row's first token from this row of the last picks (-1: none)


class DecodeGraphs:
    """Static-buffer steps for one ModelRunner; CUDA graphs when the device is a GPU.

    `forward(ids, positions, slots, seq_lens, tables, max_seq_len, q)` is the runner's decoder +
    LM head on B x q tokens (slots [groups, B x q], tables [groups, B, W]), returning [B x q,
    vocab] logits. A bound method is held weakly: the runner owns these graphs, and a reference
    back to it would make a cycle that keeps the runner, and the KV pool it reads, alive until a
    garbage collection. `close()` drops the graphs, their memory pool and the buffers at once.
    """

    def __init__(self, forward: Callable[..., torch.Tensor], device: torch.device,
                 max_batch: int, max_blocks_per_seq: int, max_seq_len: int,
                 use_graphs: bool | None = None, pad: bool | None = None,
                 num_groups: int = 1, block_size: int = 16, max_query: int = 1) -> None:
        self._forward: Callable[[], Callable[..., torch.Tensor] | None] = (
            weakref.WeakMethod(forward) if inspect.ismethod(forward) else lambda: forward)
        self.device = device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        self.pad = self.use_graphs if pad is None else pad  # round batches up to the buckets
        self.sizes = tuple(b for b in GRAPH_BATCH_SIZES if b < max_batch) + (max_batch,)
        self.max_batch, self.max_query, self.block_size = max_batch, max_query, block_size
        # a padding query of a row near the end of its context reads one block further
        self.width = max_blocks_per_seq + -(-(max_query - 1) // block_size)
        # The kernel's split-K grid is fixed at capture: size it for the longest context.
        self.max_seq_len = max_seq_len + max_query - 1
        self.num_groups = num_groups
        self.state = PersistentTables(num_groups, max_batch, self.width, device)
        b = max_batch
        self._at = {"tokens": 0, "positions": b * max_query, "drafts": b * (max_query + 1),
                    "rows": b * (max_query + 2), "fed": b * (max_query + 3),
                    "changes": b * (max_query + 4)}
        self._room = num_groups * b * self.width  # changed entries a step may send: all of them
        n = self._at["changes"] + 2 * self._room
        pin = device.type == "cuda"
        self._hosts = [torch.zeros(n, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        self._copied: list[Any] = [None, None]
        self._turn = 0
        self.host = self._hosts[0]
        self._host_np = self.host.numpy()
        self.buffer = torch.zeros(n, dtype=torch.int32, device=device)
        # the last step's picks (a step has at most B x Q rows), where the graph reads fed tokens
        self.fed_tokens = torch.zeros(b * max_query, dtype=torch.long, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], DecodeOutputs] = {}
        self._pool: Any = None
        self.num_replays = 0
        self.ratios: dict[int, float] = {}  # bucket -> a verification graph's time / a decode's
        self.check_tables = False  # compare the device's tables with the step's every step
        self.closed = False

    def close(self) -> None:
        """Let go of every graph, its outputs and memory pool, and the buffers (idempotent).
        Graphs first: a captured graph keeps its pool's memory until it is destroyed."""
        self.graphs.clear()
        self.outputs.clear()
        self._pool = None
        self._copied = [None, None]
        self._hosts, self.host, self._host_np = [], None, None
        self.buffer = self.fed_tokens = None
        self.state = None
        self.closed = True

    # ---- public -------------------------------------------------------------------------------

    def fits(self, num_seqs: int, table_width: int, q: int = 1) -> bool:
        return num_seqs <= self.max_batch and table_width <= self.width and q <= self.max_query

    def can_feed(self, rows: int) -> bool:
        """Whether the picks of a step of `rows` rows fit the buffer the graph reads fed tokens
        from (a step larger than the buckets, run without them, may leave more)."""
        return rows <= self.fed_tokens.numel()

    def bucket(self, num_seqs: int) -> int:
        if not self.pad:
            return num_seqs
        return next(b for b in self.sizes if b >= num_seqs)

    @torch.inference_mode()
    def run(self, step: DecodeStep, num_blocks: int | None = None,
            feed: Callable[[torch.Tensor], None] | None = None,
            picks: torch.Tensor | None = None) -> DecodeOutputs | None:
        """One step of len(step.positions) sequences. With `num_blocks`, the table entries sent
        are checked to name blocks of the pool; None comes back, and nothing runs, when one does
        not. `feed(ids)` writes token ids the host does not have yet into the device's ids
        (async scheduling: ids is [B, q], a row's first token); or `picks`, the last step's
        picked tokens on the device, which the rows of `step.fed` read inside the graph."""
        size = self.prepare(step, num_blocks)
        if size is None:
            return None
        if picks is not None:
            self.fed_tokens[:len(picks)].copy_(picks)
        return self.replay(size, len(step.positions), step.q, feed)

    @torch.inference_mode()
    def replay(self, size: int, n: int, q: int,
               feed: Callable[[torch.Tensor], None] | None = None) -> DecodeOutputs:
        """The step `prepare` (or `load`) put into the buffers, for its n sequences in bucket
        `size`: replayed (a GPU) or computed eagerly."""
        if feed is not None:
            feed(self.buffer[:size * q].view(size, q))
        if not self.use_graphs:
            return self._compute(size, q).rows(n, q)
        if (size, q) not in self.graphs:
            self._capture(size, q)
        self.graphs[(size, q)].replay()
        self.num_replays += 1
        return self.outputs[(size, q)].rows(n, q)

    def prepare(self, step: DecodeStep, num_blocks: int | None = None) -> int | None:
        """The step's inputs into the device's buffer and its table changes into the persistent
        tables; returns the bucket it runs in (None: a block id outside the pool was sent)."""
        rows = self.state.rows_for(step.keys)
        index: list[int] = []
        value: list[int] = []
        self.state.changes(rows, step.tables, index, value)
        if num_blocks is not None and value and (min(value) < 0 or max(value) >= num_blocks):
            self.state = PersistentTables(self.num_groups, self.max_batch, self.width, self.device)
            return None
        size = self.load(step, rows, index, value)
        if self.check_tables:
            self.state.check(rows, step.tables)
        return size

    def load(self, step: DecodeStep, rows: Sequence[int], index: Sequence[int],
             value: Sequence[int]) -> int:
        """The device half of `prepare`: the step's inputs, its rows and the (flat index, block
        id) changes of the persistent tables into the buffers, the changes scattered. A
        tensor-parallel worker calls it with the rows and changes its engine worked out (the
        engine keeps the host half: engine/tp/device_batch.py). Returns the bucket."""
        size = self.bucket(len(rows))
        self._next_host()
        used = self._fill(step, rows, size, index, value)
        self.buffer[:used].copy_(self.host[:used], non_blocking=True)
        if self.use_graphs:
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
        if len(index):  # lists here, numpy arrays from a tensor-parallel engine's message
            at, m = self._at["changes"], len(index)
            flat = self.state.tables.view(-1)
            flat.index_copy_(0, self.buffer[at:at + m].long(), self.buffer[at + m:at + 2 * m])
        return size

    @torch.inference_mode()
    def capture(self, sizes: tuple[int, ...] | None = None, queries: tuple[int, ...] = (1,),
                progress: Callable[[int, int], None] | None = None) -> None:
        """Capture the graphs of these buckets and query lengths now (default: every bucket,
        Q = 1), largest first so that the smaller ones reuse its memory pool. Otherwise each is
        captured at its first use. `progress(done, total)` is called after each one."""
        if not self.use_graphs:
            return
        todo = [(s, q) for q in sorted(queries, reverse=True)
                for s in sorted(sizes or self.sizes, reverse=True)]
        for i, (size, q) in enumerate(todo):
            if progress is not None:
                progress(i, len(todo))
            if (size, q) not in self.graphs:
                self._fill_padding(size, q)
                self.buffer.copy_(self.host)
                self._capture(size, q)
        if max(queries) > 1:
            self._measure(max(queries))

    def cost_ratio(self, num_seqs: int, q: int) -> float:
        """What a step of num_seqs sequences of q tokens costs against a decode step: measured
        when the graphs were captured, else DEFAULT_VERIFY_COST per draft token."""
        if q <= 1:
            return 1.0
        measured = self.ratios.get(self.bucket(min(num_seqs, self.max_batch)))
        return measured if measured is not None else 1.0 + DEFAULT_VERIFY_COST * (q - 1)

    def _measure(self, q: int) -> None:
        """Time each bucket's verification graph against its decode graph, replayed on padding
        rows (which write nothing): what a draft must pay for."""
        self._fill_padding(self.sizes[-1], q)
        self.buffer.copy_(self.host)

        def replay_ms(key: tuple[int, int]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.graphs[key].replay()
            start.record()
            for _ in range(3):
                self.graphs[key].replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

        for size in self.sizes:
            if (size, 1) in self.graphs and (size, q) in self.graphs:
                self.ratios[size] = replay_ms((size, q)) / replay_ms((size, 1))

    # ---- internals ------------------------------------------------------------------------------

    def _next_host(self) -> None:
        """Switch to the other pinned buffer, once its last copy to the device is done."""
        self._turn ^= 1
        if self._copied[self._turn] is not None:
            self._copied[self._turn].synchronize()
        self.host = self._hosts[self._turn]
        self._host_np = self.host.numpy()

    def _fill(self, step: DecodeStep, rows: Sequence[int], size: int, index: Sequence[int],
              value: Sequence[int]) -> int:
        h, at, n, q = self._host_np, self._at, len(rows), step.q
        h[0:n * q] = step.tokens
        p, d, r = at["positions"], at["drafts"], at["rows"]
        h[p:p + n] = step.positions
        h[d:d + n] = step.drafts
        h[r:r + n] = rows
        f = at["fed"]
        if step.fed is not None:
            h[f:f + n] = step.fed
        else:
            h[f:f + n] = -1
        if size > n:  # padding rows: no position (no write), the all-zero table row
            h[n * q:size * q] = 0
            h[p + n:p + size] = -1
            h[d + n:d + size] = 0
            h[r + n:r + size] = self.state.pad_row
            h[f + n:f + size] = -1
        if not len(index):
            return at["changes"]
        if len(index) > self._room:
            raise ValueError("more changed table entries than the decode buffers hold")
        c, m = at["changes"], len(index)
        h[c:c + m] = index
        h[c + m:c + 2 * m] = value
        return c + 2 * m

    def _fill_padding(self, size: int, q: int) -> None:
        """Every row a padding row: what a capture runs on."""
        h, at = self._host_np, self._at
        h[0:size * q] = 0
        h[at["positions"]:at["positions"] + size] = -1
        h[at["drafts"]:at["drafts"] + size] = 0
        h[at["rows"]:at["rows"] + size] = self.state.pad_row
        h[at["fed"]:at["fed"] + size] = -1

    def _compute(self, size: int, q: int) -> DecodeOutputs:
        """Positions, slots and context lengths of every query from the rows' tables, then the
        forward pass: no host reads (a capture would fail on one)."""
        at, buf, bs = self._at, self.buffer, self.block_size
        ids = buf[0:size * q].long().view(size, q)
        fed = buf[at["fed"]:at["fed"] + size].long()  # a row's first token from the last picks
        first = torch.where(fed >= 0, self.fed_tokens.index_select(0, fed.clamp(min=0)), ids[:, 0])
        ids = torch.cat([first[:, None], ids[:, 1:]], 1).flatten()
        pos = buf[at["positions"]:at["positions"] + size].long()
        drafts = buf[at["drafts"]:at["drafts"] + size].long()
        rows = buf[at["rows"]:at["rows"] + size].long()
        tables = self.state.tables.index_select(1, rows)  # [groups, size, width]
        live = pos >= 0
        base = pos.clamp(min=0)
        j = torch.arange(q, device=buf.device)
        real = (j[None, :] <= drafts[:, None]) & live[:, None]  # [size, q]: not a padding query
        # a padding query repeats its row's last real position (RoPE reads a valid one)
        qpos = base[:, None] + torch.minimum(j[None, :], drafts[:, None])
        cols = (qpos // bs)[None].expand(self.num_groups, size, q)
        blocks = tables.gather(2, cols)  # [groups, size, q]
        slots = torch.where(real[None], blocks * bs + qpos % bs, -1).flatten(1)
        seq_lens = torch.where(live, base + q, q).to(torch.int32)
        forward = self._forward()
        if forward is None:
            raise RuntimeError("the model runner these decode graphs belong to is gone")
        logits = forward(ids, qpos.flatten(), slots, seq_lens, tables, self.max_seq_len,
                         q).float()
        if not self.use_graphs:  # eager: a sampled step has no use for the greedy choice
            return DecodeOutputs(logits)
        best, best_lp = greedy_pair(logits)
        accepted = None
        if q > 1:  # the greedy picks confirm a draft's tokens while each equals its pick
            picks = best.view(size, q)[:, :q - 1]
            match = (picks == ids.view(size, q)[:, 1:]) & (j[None, :q - 1] < drafts[:, None])
            accepted = match.int().cumprod(1).sum(1)
        return DecodeOutputs(logits, best, best_lp, accepted)

    def _capture(self, size: int, q: int) -> None:
        # Warm up on a side stream first (Triton compiles its kernels, cuBLAS picks its
        # algorithms): nothing of that may happen inside the capture.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._compute(size, q)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self.outputs[(size, q)] = self._compute(size, q)
        self.graphs[(size, q)] = graph
