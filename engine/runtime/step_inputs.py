"""A step's inputs on the host: every sequence checked, its tokens packed, each token's position
and slot in every KV cache group, and the block tables as the kernels read them (numpy; the
runner moves them to the device, or into the static buffers of the prefill graphs).

A bad table is caught here, before the forward pass: it would otherwise write K/V into a block
that belongs to another sequence, silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.runtime.kv_layout import KVLayout
from engine.runtime.protocols import StepItem


@dataclass
class HostInputs:
    """One step's inputs as the host built them."""

    ids: np.ndarray  # [T] token ids
    positions: np.ndarray  # [T]
    slots: list[np.ndarray]  # per KV cache group: [T] each token's slot
    tables: list[np.ndarray]  # per KV cache group: [n, width] block tables, padded with 0
    seq_lens: np.ndarray  # [n]
    query_start: np.ndarray  # [n + 1]


class StepInputs:
    """The checks and the packing of one runner's steps (its block size, layout, model length
    and pool size)."""

    def __init__(self, block_size: int, layout: KVLayout, max_model_len: int,
                 num_gpu_blocks: int) -> None:
        self.block_size, self.layout = block_size, layout
        self.max_model_len, self.num_gpu_blocks = max_model_len, num_gpu_blocks

    def check_windows(self, i: int, seq: StepItem) -> None:
        """A sliding group's table must hold every block its window still shows the new tokens
        (the entries before it may be dropped: None, never read)."""
        bs, p = self.block_size, seq.num_computed
        for g, window in enumerate(self.layout.windows):
            if window:  # a full group's table never holds None
                table = seq.block_table if g == 0 else seq.group_tables[g - 1]
                if None in table[max(0, p - window + 1) // bs:]:
                    self.check(i, seq)

    def host(self, batch: list[StepItem], fed: bool = False) -> HostInputs:
        """A batch's packed inputs and metadata, checked, on the host. `fed`: some token ids are
        placeholders, filled on the device afterwards. The host's work grows with the
        sequences and their tables, not with the tokens: every token's position and slot is
        computed from them in a few vectorised operations (a chunk of a long prompt is
        thousands of tokens)."""
        token_ids: list[int] = []
        for i, seq in enumerate(batch):
            self.check(i, seq)
            token_ids += seq.token_ids
        # numpy, not torch, on the host: torch's CPU operations on a long chunk's thousands of
        # tokens run in parallel regions whose threads may be asleep or share a core (on an H200
        # host, 3 ms an index); numpy's take microseconds, on one thread
        n = len(batch)
        q_lens = np.fromiter((len(s.token_ids) for s in batch), np.int64, n)
        starts = np.fromiter((s.num_computed for s in batch), np.int64, n)
        query_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(q_lens, out=query_start[1:])
        seq_of = np.repeat(np.arange(n), q_lens)  # each token's sequence
        positions = (starts - query_start[:-1])[seq_of] + np.arange(len(token_ids))
        ids = np.array(token_ids, dtype=np.int64)
        if fed:  # placeholders (the in-flight marker) read as token 0 until the feed writes them
            np.maximum(ids, 0, out=ids)
        slots, tables = self._tables_and_slots(batch, seq_of, positions)
        return HostInputs(ids, positions, slots, tables, starts + q_lens, query_start)

    def _tables_and_slots(self, batch: list[StepItem], seq_of: np.ndarray, positions: np.ndarray
                          ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each KV cache group's slot of every token and padded block tables."""
        bs = self.block_size
        slot_mappings, block_tables = [], []
        for g, window in enumerate(self.layout.windows):
            tables = [seq.block_table if g == 0 else seq.group_tables[g - 1] for seq in batch]
            width = max(map(len, tables))
            if window:  # only the entries from the window's first block on: the kernels read
                # no entry before it (0 there), and a decode's window is a few blocks of a
                # table as long as its context
                padded = np.zeros((len(batch), width), dtype=np.int32)
                for i, (seq, table) in enumerate(zip(batch, tables, strict=True)):
                    first = max(0, seq.num_computed - window + 1) // bs
                    padded[i, first:len(table)] = table[first:]
            else:
                flat: list[int] = []
                for table in tables:
                    flat += table
                    flat += [0] * (width - len(table))
                padded = np.array(flat, dtype=np.int32).reshape(len(batch), width)
            slot_mappings.append(padded[seq_of, positions // bs].astype(np.int64) * bs + positions % bs)
            block_tables.append(padded)
        return slot_mappings, block_tables

    def check(self, i: int, seq: StepItem) -> None:
        # Checked before the forward pass: a bad table would otherwise write K/V into a block
        # that belongs to another sequence, silently.
        if len(seq.token_ids) < 1:
            raise ValueError(f"sequence {i} of the batch has no new tokens")
        if seq.num_computed < 0:
            raise ValueError(f"sequence {i}: num_computed must be >= 0, got {seq.num_computed}")
        seq_len = seq.num_computed + len(seq.token_ids)
        if seq_len > self.max_model_len:
            raise ValueError(f"sequence {i} would reach {seq_len} tokens; the model handles at "
                             f"most {self.max_model_len}")
        if len(seq.group_tables) != self.layout.num_groups - 1:
            raise ValueError(f"sequence {i} has {len(seq.group_tables) + 1} block tables; this "
                             f"model has {self.layout.num_groups} KV cache groups")
        needed = -(-seq_len // self.block_size)
        for g, table in enumerate(seq.tables()):
            self._check_table(i, g, table, needed, seq.num_computed)

    def _check_table(self, i: int, g: int, table: list[int | None], needed: int,
                     num_computed: int) -> None:
        if len(table) < needed:
            raise ValueError(f"sequence {i} needs {needed} blocks for its tokens at block "
                             f"size {self.block_size}, its table has {len(table)}")
        window = self.layout.windows[g]
        if window:  # dropped entries (None) only where no new token looks
            first = max(0, num_computed - window + 1) // self.block_size
            table = table[first:]  # the kernels read no entry before (0 in `_tables_and_slots`)
            if None in table:
                raise ValueError(f"sequence {i}: a block its sliding window still sees was dropped")
        n = self.num_gpu_blocks
        if not table or (min(table) >= 0 and max(table) < n):
            return  # the common case, at C speed: this runs for every sequence of every step
        for block in table:
            if not 0 <= block < n:
                raise ValueError(f"sequence {i}: block id {block} is outside the pool "
                                 f"(0..{n - 1})")
