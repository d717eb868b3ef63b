"""The block tables of the decode batch, kept on the device from step to step.

A decode step used to copy every running sequence's whole block table (in every KV cache group)
into the step's input buffer: B x W x G entries of host work a step, for tables that change by
one entry every block_size steps. Here each sequence that decodes owns a row of a device tensor
`tables[groups, rows, width]` for as long as it keeps decoding, and a step sends only what
changed since the sequence's last step (vLLM's persistent batch does the same):

- a sequence new to the batch (just prefilled, swapped in, resumed, forked) gets a free row and
  its whole tables;
- a sequence that stays sends the entries of its tables that changed: usually none, or the end
  (a new block, a copy-on-write of the last block, draft blocks); a table that got shorter (a
  rejected draft's block given back) sends nothing: entries past a sequence's length are never
  read;
- a row whose sequence left the batch (finished, preempted, freed) goes back to the free rows.

The host keeps a mirror of each row and compares it with the sequence's tables every step (a
list comparison at C speed, no assumption about where the bookkeeping changed them: a restored
checkpoint, say); where they differ it finds the changed end, or resends the row. Entries a
sliding window dropped (None) are never read by the kernels: they keep whatever the row held,
and a drop sends nothing, so a sliding group's row is patched by its appends like a full one's
(it used to be resent whole each time the window passed a block: every block_size steps a
sequence, a table as long as the context).
`check(tables)` compares whole device rows with the bookkeeping's tables (the tests turn it on,
with EngineConfig.track_kv_content): a missed change would have a sequence read another's K/V.

Host work per step: a dictionary lookup and a list comparison per sequence, plus the entries
that changed. The changes go to the device in the step's one input transfer as
(flat index, block id) pairs and are scattered into the tables with one kernel.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import compress
from operator import ne

import torch

Table = Sequence[int | None]


class PersistentTables:
    """`rows` rows of `width` entries per KV cache group on `device`, plus one all-zero row
    (`pad_row`) that padding rows of a step read."""

    def __init__(self, num_groups: int, rows: int, width: int, device: torch.device) -> None:
        self.num_groups, self.rows, self.width = num_groups, rows, width
        self.pad_row = rows
        self.tables = torch.zeros((num_groups, rows + 1, width), dtype=torch.int32, device=device)
        self._mirror: list[list[list[int]]] = [[[] for _ in range(rows)] for _ in range(num_groups)]
        self._row_of: dict[Hashable, int] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._last_keys: tuple = ()

    def rows_for(self, keys: list[Hashable | None]) -> list[int]:
        """The row of each of this step's sequences (by key; None: a sequence without one, which
        gets a row for this step only). Rows of sequences not in this step are freed first."""
        row_of = self._row_of
        if tuple(keys) != self._last_keys:  # the batch changed: let go of who left
            present = set(keys)
            for key in [k for k in row_of if k not in present]:
                self._release(row_of.pop(key))
        else:  # the same sequences as the step before (most steps): each has its row
            return list(map(row_of.__getitem__, keys))
        rows = []
        for key in keys:
            row = row_of.get(key) if key is not None else None
            if row is None:
                if not self._free:
                    raise RuntimeError(f"the persistent batch holds {self.rows} rows; a step "
                                       f"asked for more")
                row = self._free.pop()
                if key is not None:
                    row_of[key] = row
            rows.append(row)
        for key, row in zip(keys, rows, strict=True):  # rows of key-less sequences: this step only
            if key is None:
                self._release(row)
        self._last_keys = tuple(keys) if None not in keys else ()
        return rows

    def changes(self, rows: list[int], tables: list[list[Table]], out_index: list[int],
                out_value: list[int]) -> None:
        """Append to out_index / out_value the (flat index into `tables`, block id) pairs that
        bring each row up to its sequence's tables (`tables[g][i]`: group g's table of the step's
        sequence i), and update the mirror. A fresh row (empty mirror) gets its whole table."""
        w, per_group = self.width, (self.rows + 1) * self.width
        for g in range(self.num_groups):
            mirror, base, group = self._mirror[g], g * per_group, tables[g]
            if len(group) != len(rows):
                raise ValueError(f"{len(rows)} rows but {len(group)} tables in group {g}")
            held = [mirror[row] for row in rows]
            # only the rows whose tables changed, found at C speed (most rows, most steps: none)
            for i in compress(range(len(rows)), map(ne, group, held)):
                row, table, known = rows[i], group[i], held[i]
                n = len(table)
                if n > w:
                    raise ValueError(f"a block table of {n} entries is wider than the decode "
                                     f"batch's {w}")
                start = min(n, len(known))
                while start > 0 and table[start - 1] != known[start - 1]:
                    start -= 1  # an end replaced (copy-on-write, a draft's blocks again)
                if table[:start] != known[:start] and not _dropped_only(table, known, start):
                    start = 0  # a change before the end: the whole row
                at = base + row * w
                for j in range(start, n):
                    b = table[j]
                    if b is not None:
                        out_index.append(at + j)
                        out_value.append(b)
                mirror[row] = list(table)

    def check(self, rows: list[int], tables: list[list[Table]]) -> None:
        """Raise when a row's entries on the device differ from its sequence's table (entries a
        window dropped aside). Reads the device: for tests."""
        dev = self.tables.cpu()
        for g in range(self.num_groups):
            for i, (row, table) in enumerate(zip(rows, tables[g], strict=True)):
                have = dev[g, row, :len(table)].tolist()
                want = [h if b is None else b for h, b in zip(have, table, strict=True)]
                if have != want:
                    raise AssertionError(f"decode row {row} (sequence {i} of the step, group {g}) "
                                         f"holds {have}, its table is {list(table)}")

    def _release(self, row: int) -> None:
        for mirror in self._mirror:
            mirror[row] = []
        self._free.append(row)


def _dropped_only(table: Table, known: list, end: int) -> bool:
    """Whether the first `end` entries differ from what the row holds only where a sliding
    window dropped them (None: a run at the table's start, never read again, so the row keeps
    whatever it held there): then only the entries from `end` on need sending."""
    d = table.count(None)
    return d <= end and table[d:end] == known[d:end] and table[:d] == [None] * d
