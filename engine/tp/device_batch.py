"""The engine's half of the workers' persistent batch (issue 31's rows and tables, under TP).

In one process, `DecodeGraphs.prepare` keeps a host mirror of the device's decode rows, finds
each step's changed table entries and ships them with the step. Under tensor parallelism the
engine holds the tables and every worker holds the device rows, so the mirror lives here: the
engine decides which steps run from the decode buffers (exactly as `ModelRunner.execute_scores`
would), assigns rows, finds the changed entries, and sends them in the step's message
(engine/tp/step_message.py); each worker scatters them into its own rows
(`DecodeGraphs.load`). Every rank's rows thus hold the same block ids as the engine's tables:
a test turns on `check` and has the workers compare every step.

`GraphSpec` is what the engine must know of the workers' decode graphs to decide alike: sent
by worker 0 when it starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.runtime.decode_graphs import DEFAULT_VERIFY_COST
from engine.runtime.persistent_batch import PersistentTables
from engine.runtime.protocols import StepItem
from engine.tp.step_message import DeviceStep


@dataclass(frozen=True)
class GraphSpec:
    """The workers' decode graphs, as the engine needs to know them."""

    use_graphs: bool  # CUDA graphs (a GPU); else the same buffers run eagerly
    pad: bool  # batches rounded up to `sizes`
    static_queries: bool  # steps of up to max_query tokens a sequence too (always on a GPU)
    sizes: tuple[int, ...]
    max_batch: int
    max_query: int
    width: int  # entries of a persistent table row
    block_size: int
    windows: tuple[int | None, ...]  # each KV cache group's sliding window (None: full)
    max_model_len: int
    num_blocks: int
    ratios: dict[int, float] = field(default_factory=dict)  # bucket -> verify / decode time

    @staticmethod
    def of(runner: Any) -> dict[str, Any]:
        """A worker's ModelRunner's graphs, as plain data for the hello message."""
        g = runner.graphs
        return {"use_graphs": g.use_graphs, "pad": g.pad, "sizes": tuple(g.sizes),
                "static_queries": g.use_graphs or runner.static_queries,
                "max_batch": g.max_batch, "max_query": g.max_query, "width": g.width,
                "block_size": g.block_size, "windows": tuple(runner.layout.windows),
                "max_model_len": runner.max_model_len,
                "num_blocks": runner.cache.num_gpu_blocks, "ratios": dict(g.ratios)}


class DeviceBatch:
    """Which steps the workers run from their decode buffers, and the rows and changed table
    entries each such step sends. `check`: send every table too (tests)."""

    def __init__(self, spec: GraphSpec, check: bool = False) -> None:
        self.spec, self.check = spec, check
        self._reset()

    def _reset(self) -> None:
        s = self.spec
        self.tables = PersistentTables(len(s.windows), s.max_batch, s.width, torch.device("cpu"))
        self._last_rows: list[int] | None = None

    def query_len(self, items: Sequence[StepItem]) -> int | None:
        """The q a device step of `items` runs with, or None for the general path (the rule of
        ModelRunner.execute_scores, where a worker would apply it)."""
        s = self.spec
        q = max(len(it.token_ids) for it in items)
        if 1 < q <= s.max_query and s.static_queries:
            q = s.max_query  # one graph a bucket: every short row padded to it
        width = max(len(it.block_table) for it in items)
        if (q == 1 or (q == s.max_query and s.static_queries)) and len(items) <= s.max_batch \
                and width <= s.width and q <= s.max_query:
            return q
        return None

    def plan(self, items: Sequence[StepItem], fed: Sequence[int] = ()) -> DeviceStep | None:
        """The device step of `items`, or None where they take the general path (then a worker
        checks them in full and says what is wrong). `fed`: items whose token the workers read
        from their last step's picks."""
        q = self.query_len(items)
        if q is None or not self._valid(items, q):
            return None
        positions = [it.num_computed for it in items]
        if q == 1:
            tokens, drafts, logits = [it.token_ids[0] for it in items], None, None
        else:
            tokens = [t for it in items for t in (*it.token_ids, *[0] * (q - len(it.token_ids)))]
            drafts = [len(it.token_ids) - 1 for it in items]
            logits = [it.num_logits for it in items]
        for i in fed:
            tokens[i * q] = 0
        groups = len(self.spec.windows)
        tables = [[it.block_table for it in items]]
        tables += [[it.group_tables[g] for it in items] for g in range(groups - 1)]
        rows = self.tables.rows_for([it.key for it in items])
        index: list[int] = []
        value: list[int] = []
        self.tables.changes(rows, tables, index, value)
        if value and (min(value) < 0 or max(value) >= self.spec.num_blocks):
            self._reset()  # every row is sent whole next time: the workers' rows follow
            return None
        sent_rows = None if rows == self._last_rows else rows
        self._last_rows = rows
        check = [[list(t) for t in g] for g in tables] if self.check else None
        return DeviceStep(q, tokens, positions, drafts, logits, sent_rows, index, value,
                          check=check)

    def _valid(self, items: Sequence[StepItem], q: int) -> bool:
        """ModelRunner.decode's checks, at C speed where it can: anything odd goes the general
        path, whose full check on the worker names it."""
        s, bs = self.spec, self.spec.block_size
        positions = [it.num_computed for it in items]
        lengths = [len(it.token_ids) for it in items]
        if (min(positions) < 0 or min(lengths) < 1 or max(lengths) > q
                or max(map(int.__add__, positions, lengths)) > s.max_model_len
                or any(len(it.block_table) <= (p + n - 1) // bs
                       for it, p, n in zip(items, positions, lengths, strict=True))
                or any(len(it.group_tables) != len(s.windows) - 1 for it in items)):
            return False
        for g, window in enumerate(s.windows):
            if window:  # a sliding group: every block its window still shows must be there
                for it in items:
                    table = it.block_table if g == 0 else it.group_tables[g - 1]
                    if None in table[max(0, it.num_computed - window + 1) // bs:]:
                        return False
        return True

    def cost_ratio(self, num_seqs: int, q: int) -> float:
        """A step of q tokens a sequence against a decode step: measured by worker 0 when it
        captured its graphs, else DEFAULT_VERIFY_COST per draft token (as DecodeGraphs)."""
        s = self.spec
        if q <= 1:
            return 1.0
        n = min(num_seqs, s.max_batch)
        bucket = next(b for b in s.sizes if b >= n) if s.pad else n
        measured = s.ratios.get(bucket)
        return measured if measured is not None else 1.0 + DEFAULT_VERIFY_COST * (q - 1)
