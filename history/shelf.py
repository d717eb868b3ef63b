"""Where a run's checkpoints are kept, and how many: one every EVERY operations at first; past
MOST of them, or past the bytes they may hold, the spacing doubles (every other one goes), so a
long log keeps few and moving back replays at most about len(log) / MOST * 2 operations.

A segment start (position 0, or where a lesson started a fresh engine) is always kept: it is
the cheapest way back to the start of the engine's log. What a checkpoint is belongs to the
engine (`LLMEngine.checkpoint()`); this module only decides which positions keep one."""

from __future__ import annotations

from typing import Any

#: a checkpoint every EVERY operations at first
EVERY = 8
#: at most this many kept
MOST = 12


class Shelf:
    """Checkpoints by log position."""

    def __init__(self) -> None:
        self.every = EVERY
        self._kept: dict[int, Any] = {}  # position -> engine checkpoint
        self._starts: set[int] = set()  # segment starts: never thinned

    def __len__(self) -> int:
        return len(self._kept)

    def positions(self) -> list[int]:
        return sorted(self._kept)

    def held_bytes(self) -> int:
        """The K/V bytes the kept checkpoints hold."""
        return sum(c.kv_bytes for c in self._kept.values())

    def due(self, pos: int, start: bool = False) -> bool:
        """Whether a checkpoint is wanted at `pos` (and none is kept there yet)."""
        return pos not in self._kept and (start or pos % self.every == 0)

    def keep(self, pos: int, checkpoint: Any, max_bytes: int, start: bool = False) -> None:
        """Keep `checkpoint` at `pos`; then thin the shelf until it holds at most MOST checkpoints
        of at most `max_bytes` (segment starts aside)."""
        self._kept[pos] = checkpoint
        if start:
            self._starts.add(pos)
        while len(self._thinnable()) > 1 and (len(self._kept) > MOST
                                              or self.held_bytes() > max_bytes):
            self.every *= 2
            self._kept = {p: c for p, c in self._kept.items()
                          if p % self.every == 0 or p in self._starts}

    def best(self, target: int, since: int) -> tuple[int, Any] | None:
        """The kept checkpoint nearest before or at `target` and at or after `since` (the
        target's segment start), or None."""
        usable = [p for p in self._kept if since <= p <= target]
        return (max(usable), self._kept[max(usable)]) if usable else None

    def drop_after(self, pos: int) -> None:
        """The log now ends at `pos`: checkpoints after it are of a future that is gone."""
        self._kept = {p: c for p, c in self._kept.items() if p <= pos}
        self._starts = {p for p in self._starts if p <= pos}

    def clear(self) -> None:
        self._kept, self._starts = {}, set()

    def _thinnable(self) -> list[int]:
        return [p for p in self._kept if p not in self._starts]
