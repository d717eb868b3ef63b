"""The engine's link to its tensor-parallel workers: start them, talk to them, notice them die.

One shared-memory ring carries the engine's messages to every worker (engine/tp/shm_ring.py:
written once, read by all), and one ring per worker carries that worker's replies back: worker
0 answers every step (its picks), the others answer only when the inspector reads their slice
of a block. The rings and the rendezvous store (a FileStore for the workers' own process group)
live in a private folder, on /dev/shm where there is one: no port is open, nothing from the
network reaches a message.

Waiting polls the rings and, every few milliseconds, the workers' processes and the store's
error reports, so a dead or stuck worker is an error naming it within a bounded time.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
import weakref
from collections import deque
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from engine.tp.launch import STOP_TIMEOUT_S, Workers, start_workers, stop_workers
from engine.tp.shm_ring import ShmRing, Waiter
from engine.tp.step_message import encode_object

START_TIMEOUT_S = 600.0  # loading and sharding a model in every worker
STEP_TIMEOUT_S = 120.0  # the longest a step may take before the engine calls a worker stuck
_START_HINT = " (its output, if it left any, is on stderr above)"
CTL_SLOTS, REPLY_SLOTS, SLOT_BYTES = 32, 16, 64 * 1024


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker died, hung or failed; the engine stopped all of them."""


def ring_paths(folder: str, size: int) -> tuple[str, list[str]]:
    """Where the engine's ring and each worker's reply ring live in the private folder."""
    return (os.path.join(folder, "ctl.ring"),
            [os.path.join(folder, f"reply{r}.ring") for r in range(size)])


class WorkerLink:
    """`size` worker processes for one engine: their rings, their health, their hello."""

    def __init__(self, size: int, config: dict[str, Any], start_timeout_s: float) -> None:
        self.size = size
        self.step_timeout_s = STEP_TIMEOUT_S
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        folder = tempfile.mkdtemp(prefix="pagedlab-tp-", dir=shm)  # private (0700)
        store = dist.FileStore(os.path.join(folder, "store"), size + 1)
        store.set_timeout(timedelta(seconds=start_timeout_s))
        ctl, replies = ring_paths(folder, size)
        ShmRing.create(ctl, size, CTL_SLOTS, SLOT_BYTES)
        for path in replies:
            ShmRing.create(path, 1, REPLY_SLOTS, SLOT_BYTES)
        self._w = Workers([], store, folder)
        self._finalizer = weakref.finalize(self, stop_workers, self._w, True)
        self._w.ctl = ShmRing(ctl)
        self._w.replies = [ShmRing(p, 0) for p in replies]
        self._inbox: list[deque[bytes]] = [deque() for _ in range(size)]
        self.error: str | None = None
        self.spin_s = 0.0  # a GPU's steps answer in about a millisecond: spin then (hello says)
        self.wait_s = 0.0  # time spent waiting for replies, summed (the bench reads it)
        threads = max(1, (os.cpu_count() or 1) // size)
        try:
            self._w.procs, self._w.lifeline = start_workers(
                size, folder, os.path.join(folder, "store"), config, threads)
            self._await_ready(start_timeout_s)
            self.hello = pickle.loads(self._read(0, self._waiter(start_timeout_s, "its start")))
        except BaseException:
            self.stop()
            raise
        if str(self.hello.get("device", "")).startswith("cuda"):
            self.spin_s = 1.0

    @property
    def folder(self) -> str:
        return self._w.folder

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._w.procs]

    @property
    def stopped(self) -> bool:
        return self._w.stopped

    def close(self) -> None:
        self._finalizer()

    def stop(self) -> None:
        """Kill the workers now (after a failure: nobody to ask politely)."""
        stop_workers(self._w, polite=False)

    # ---- messages -------------------------------------------------------------------------------

    def send(self, payload: bytes) -> None:
        """One message to every worker; waits for room in the ring (reading replies meanwhile,
        so that worker 0 is never stuck behind a full reply ring)."""
        self.drain()
        self._w.ctl.write(payload, self._waiter(self.step_timeout_s, "room for the next message",
                                                drain=True))

    def send_object(self, obj: dict[str, Any]) -> int:
        payload = encode_object(obj)
        self.send(payload)
        return len(payload)

    def reply(self, rank: int, what: str = "reply") -> bytes:
        """The next message from worker `rank` (in the order it sent them)."""
        if self._inbox[rank]:
            return self._inbox[rank].popleft()
        start = time.perf_counter()
        try:
            return self._read(rank, self._waiter(self.step_timeout_s, f"{what} of rank {rank}"))
        finally:
            self.wait_s += time.perf_counter() - start

    def drain(self) -> None:
        """Take every reply that has arrived into the inboxes (never waits)."""
        for rank, ring in enumerate(self._w.replies):
            while ring.ready():
                self._inbox[rank].append(ring.read(Waiter()))

    def _read(self, rank: int, wait: Waiter) -> bytes:
        return self._w.replies[rank].read(wait)

    def _waiter(self, timeout_s: float, what: str, drain: bool = False) -> Waiter:
        deadline = time.monotonic() + timeout_s

        def check() -> None:
            self.check_alive()
            if drain:
                self.drain()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the tensor-parallel workers did not answer within "
                                   f"{timeout_s:g} s (waiting for {what})")

        return Waiter(self.spin_s, 0.001, check)

    # ---- health ---------------------------------------------------------------------------------

    def _await_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        store, n = self._w.store, self.size
        while not all(store.check([f"ready/{r}"]) for r in range(n)):
            errors = self.worker_errors()
            bad = [e for e in errors.values() if e.startswith("ValueError")]
            if bad:  # a bad setting (e.g. a size that does not divide the heads): the user's fix
                raise ValueError(bad[0].removeprefix("ValueError: "))
            self.check_alive()
            if time.monotonic() > deadline:
                raise TensorParallelError(f"the {n} tensor-parallel workers were not ready "
                                          f"within {timeout_s:g} s")
            time.sleep(0.05)

    def worker_errors(self) -> dict[int, str]:
        out = {}
        for r in range(self.size):
            key = f"error/{r}"
            if self._w.store.check([key]):
                out[r] = self._w.store.get(key).decode(errors="replace")
        return out

    def check_alive(self) -> None:
        dead = [(r, p) for r, p in enumerate(self._w.procs) if p.exitcode is not None]
        if dead:
            time.sleep(0.05)  # let a dying worker's report reach the store
            errors = self.worker_errors()
            parts = []
            for r, p in dead:
                why = errors.get(r, "no error report: killed or crashed")
                parts.append(f"rank {r} (pid {p.pid}) exited with code {p.exitcode}: {why}")
            raise TensorParallelError("tensor-parallel worker died: " + "; ".join(parts))

    def check_usable(self) -> None:
        """Raise if an earlier failure or close() stopped the workers."""
        if self.error is not None:
            raise TensorParallelError(f"{self.error}. This engine's workers are stopped; build a "
                                      f"new engine (the session replays its log)")
        if self._w.stopped:
            raise TensorParallelError("this engine was closed and its workers are stopped; build "
                                      "a new engine")

    def call(self, fn: Any, *args: Any) -> Any:
        """Run one exchange with the workers; any failure stops them all and is reported."""
        self.check_usable()
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - dead peer, timeout, a worker's failure
            msg = str(err) if isinstance(err, TensorParallelError | TimeoutError) else (
                f"talking to the tensor-parallel workers failed ({type(err).__name__}: "
                f"{str(err)[:300]})")
            # A worker that failed usually exits a moment later: wait briefly for its exit
            # status so the message can name it (a stuck worker is alive: nothing to wait for).
            deadline = time.monotonic() + (0 if isinstance(err, TimeoutError) else 2.0)
            while time.monotonic() < deadline:
                try:
                    self.check_alive()
                except TensorParallelError as dead:
                    msg = str(dead)
                    break
                time.sleep(0.02)
            self.error = msg
            self.stop()
            raise TensorParallelError(f"{msg}; the engine stopped all {self.size} workers") from err


def start_link(size: int, config: dict[str, Any], start_timeout_s: float) -> WorkerLink:
    """A WorkerLink, or a clear error: a bad setting stays a ValueError (the user's fix)."""
    try:
        return WorkerLink(size, config, start_timeout_s)
    except BaseException as err:  # the link stopped what it had started
        if isinstance(err, ValueError) or not isinstance(err, Exception):
            raise  # a bad setting (the user's fix), or Ctrl-C
        hint = _START_HINT if "no error report" in str(err) else ""
        if isinstance(err, TensorParallelError):
            raise TensorParallelError(f"{err}{hint}") from err
        raise TensorParallelError(f"starting {size} tensor-parallel workers failed: "
                                  f"{type(err).__name__}: {err}{hint}") from err


__all__ = ["STOP_TIMEOUT_S", "TensorParallelError", "WorkerLink", "start_link"]
