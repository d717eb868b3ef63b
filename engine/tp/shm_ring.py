"""A shared-memory ring: one writer, N readers, messages of any length, no socket on the way.

How the engine talks to its tensor-parallel workers (vLLM's `shm_broadcast.MessageQueue` is
the model): the engine writes each step's message once into a ring of slots in a file mapped by
every process; each worker polls the next slot's sequence number and copies the message out.
Replies go the other way in a ring of one reader. A message costs a memcpy and a few loads,
where a gloo broadcast over the loopback cost two TCP round trips and a pickle.

Layout of the mapped file (every counter an aligned uint64: a load or store of one is atomic
on x86-64 and aarch64):

    [ consumed[reader], one cache line each | slot 0 | slot 1 | ... ]
    slot: [ seq | length | more | pad to 64 bytes | data, slot_bytes ]

The writer puts message piece k (a message longer than a slot goes in pieces, `more` set on all
but the last) into slot (k - 1) % slots once every reader has consumed piece k - slots, copies
the data, and stores `seq = k` last; a reader waits for `seq == k`, copies, and stores
`consumed = k`. Stores become visible in program order on x86-64 (TSO); `_fence` orders them
elsewhere (a lock's acquire and release are full barriers in CPython's C code).

Waiting spins (yielding the core) for `spin_s`, then sleeps in short naps: a GPU step answers in
about a millisecond, while an idle CPU test must not burn the two cores other processes need.
`check()` is called now and then while waiting: it raises when the other side died or took too
long, which is how a dead worker becomes an error instead of a hang.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable

import numpy as np

LINE = 64  # one cache line: counters of different processes never share one
_fence_lock = threading.Lock()


def _fence() -> None:
    with _fence_lock:  # acquire + release: a full memory barrier
        pass


class Waiter:
    """How a side waits: spin for `spin_s`, then nap (growing to `max_nap_s`); `check()` every
    `check_every_s` (None: never)."""

    def __init__(self, spin_s: float = 0.0, max_nap_s: float = 0.001,
                 check: Callable[[], None] | None = None, check_every_s: float = 0.005) -> None:
        self.spin_s, self.max_nap_s = spin_s, max_nap_s
        self.check, self.check_every_s = check, check_every_s

    def until(self, ready: Callable[[], bool]) -> None:
        if ready():
            return
        start = last = time.monotonic()
        nap = 2e-5
        while not ready():
            now = time.monotonic()
            if self.check is not None and now - last >= self.check_every_s:
                last = now
                self.check()
            if now - start < self.spin_s:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(nap * 2, self.max_nap_s)


class ShmRing:
    """One side of a ring in the file `path`: the writer (`reader is None`) or reader `reader`."""

    def __init__(self, path: str, reader: int | None = None) -> None:
        self.path, self.reader = path, reader
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        head = np.frombuffer(self._map, dtype=np.uint64, count=3)
        self.readers, self.slots, self.slot_bytes = (int(v) for v in head)
        self._consumed = np.frombuffer(self._map, dtype=np.uint64, count=self.readers * 8,
                                       offset=LINE).reshape(self.readers, 8)[:, 0]
        self._first = LINE * (1 + self.readers)
        self._stride = LINE + self.slot_bytes
        n = self.slots * self._stride // 8
        self._words = np.frombuffer(self._map, dtype=np.uint64, count=n, offset=self._first)
        self._seq = 0  # pieces this side has written (writer) or consumed (reader)

    @staticmethod
    def create(path: str, readers: int, slots: int = 16, slot_bytes: int = 256 * 1024) -> None:
        """Make the ring's file (zeroed: no piece written, none consumed)."""
        if slot_bytes % LINE:
            raise ValueError(f"slot_bytes must be a multiple of {LINE}")
        size = LINE * (1 + readers) + slots * (LINE + slot_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            os.pwrite(fd, np.array([readers, slots, slot_bytes], dtype=np.uint64).tobytes(), 0)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap (idempotent); views into the map are dropped first."""
        if self._map is not None:
            self._consumed = self._words = None
            try:
                self._map.close()
            except BufferError:  # a caller still holds a view of a message: left to the GC
                pass
            self._map = None

    # ---- writer ---------------------------------------------------------------------------------

    def write(self, payload: bytes | bytearray | memoryview, wait: Waiter) -> None:
        """Put one message into the ring (in pieces if longer than a slot), waiting for room."""
        view = memoryview(payload).cast("B")
        total, done = len(view), 0
        while True:
            piece = min(total - done, self.slot_bytes)
            seq = self._seq + 1
            oldest = seq - self.slots  # the piece this slot held: every reader must be past it
            if oldest > 0:
                wait.until(lambda old=oldest: int(self._consumed.min()) >= old)
            at = self._slot(seq)
            start = self._first + at * self._stride + LINE
            self._map[start:start + piece] = view[done:done + piece]
            w = at * self._stride // 8
            self._words[w + 1] = piece
            self._words[w + 2] = 1 if done + piece < total else 0
            _fence()
            self._words[w] = seq  # last: the piece is complete once a reader sees this
            self._seq = seq
            done += piece
            if done >= total:
                return

    # ---- reader ---------------------------------------------------------------------------------

    def read(self, wait: Waiter) -> bytes:
        """The next message, waiting for it."""
        parts = []
        while True:
            seq = self._seq + 1
            w = self._slot(seq) * self._stride // 8
            words = self._words
            wait.until(lambda w=w, seq=seq, words=words: int(words[w]) == seq)
            _fence()
            piece, more = int(words[w + 1]), int(words[w + 2])
            start = self._first + self._slot(seq) * self._stride + LINE
            parts.append(self._map[start:start + piece])
            _fence()
            self._consumed[self.reader] = seq
            self._seq = seq
            if not more:
                return parts[0] if len(parts) == 1 else b"".join(parts)

    def ready(self) -> bool:
        """Whether the next message (its first piece) is there (a reader's non-blocking test)."""
        seq = self._seq + 1
        return int(self._words[self._slot(seq) * self._stride // 8]) == seq

    def _slot(self, seq: int) -> int:
        return (seq - 1) % self.slots
