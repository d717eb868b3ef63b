"""The memory that the browser sessions' engines may hold together, and who lets go when it is full.

A Space has a fixed amount of memory (CPU basic: 16 GB for everything, the model and Gradio
included), and each session that holds a real-model engine holds its KV pool (the pool's blocks,
the swap space and the CPU tier, at the model's bytes per block) and checkpoints of it, which
ui/session.py caps at the pool's own size. So a session is counted at twice its pool from the
moment it builds an engine until it lets go (`reserve`); a dry session's bookkeeping is small and
counted at DRY_BYTES.

When a new engine does not fit, sessions idle for PRESSURE_IDLE_S let go first, the least
recently active first; a session idle for IDLE_S lets go whatever the pressure. A session that
let go keeps its operation log and recorded views (Back, Next and the timeline still draw) and
rebuilds its engine from the log at its next action, which tells the visitor so. When nothing
can let go, the new engine is refused with a message that says what to do instead.

The account is process-wide, like the model weights it sits beside: one per process (BUDGET).
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from ui import limits
from ui.limits import UserError

#: what a dry session's engine is counted at (bookkeeping and views, no tensors)
DRY_BYTES = 1 << 20
MIB = 1 << 20


def reserve(config: Any, bytes_per_block: int | None) -> int:
    """The bytes a session with this engine config is counted at: its pool, swap space and CPU
    tier, twice (the checkpoints may hold as much again), or DRY_BYTES in the dry mode."""
    if config.dry or not bytes_per_block:
        return DRY_BYTES
    blocks = config.num_gpu_blocks + config.num_cpu_blocks + config.num_offload_blocks
    return 2 * blocks * bytes_per_block


class SessionBudget:
    """Sessions that hold an engine, each with the bytes it is counted at (weakly: a session
    dropped by Gradio leaves the account with its engine)."""

    def __init__(self, budget_bytes: int, max_sessions: int, idle_s: float,
                 pressure_idle_s: float) -> None:
        self.budget_bytes = budget_bytes
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.pressure_idle_s = pressure_idle_s
        self._held: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._block_bytes: dict[tuple, int] = {}  # (model, device, dtype) -> bytes per block
        self._lock = threading.Lock()

    def held_bytes(self) -> int:
        with self._lock:
            return sum(self._held.values())

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, session: Any) -> bool:
        return session in self._held

    def block_bytes(self, config: Any) -> int | None:
        """Bytes per block of this config's model, once an engine of it has said (engine_info)."""
        return self._block_bytes.get(_model_key(config))

    def learn(self, config: Any, info: dict[str, Any]) -> None:
        if not config.dry and info.get("kv bytes per block"):
            self._block_bytes[_model_key(config)] = int(info["kv bytes per block"])

    def admit(self, session: Any, need: int, max_sessions: int | None = None) -> None:
        """Count `session` at `need` bytes (again, when it already holds an engine), letting idle
        sessions go to make room; refused, with what to do, when too many sessions hold engines
        or the budget cannot hold this one."""
        most = self.max_sessions if max_sessions is None else max_sessions
        for victim in self._victims(session, need, most):
            victim.let_go(idle=True)
        with self._lock:
            before = self._held.get(session)
            held = sum(self._held.values()) - (before or 0)
            if before is None and len(self._held) >= most:
                raise UserError(f"PagedLab is serving {most} sessions, the most it holds at "
                                "once; try again in a minute")
            if need > (before or 0) and held + need > self.budget_bytes:
                raise UserError(
                    f"PagedLab's sessions hold {_mib(held)} of the {_mib(self.budget_bytes)} MiB "
                    f"it gives them, and this engine needs {_mib(need)} MiB more: choose "
                    "a smaller pool or the dry mode in Settings, try again in a few minutes (idle "
                    "sessions let go), or run PagedLab on your own machine (bash scripts/run.sh)")
            self._held[session] = need

    def release(self, session: Any) -> None:
        with self._lock:
            self._held.pop(session, None)

    def sweep(self) -> int:
        """Let go of every session idle for IDLE_S (a cheap walk; called on each admission and
        on each acting click). Returns how many let go."""
        now = time.monotonic()
        with self._lock:
            stale = [s for s in self._held if now - s.active_at >= self.idle_s]
        return sum(1 for s in stale if s.let_go(idle=True))

    def _victims(self, session: Any, need: int, most: int) -> list[Any]:
        """Sessions to let go so that `need` more bytes fit: all idle for IDLE_S, then, least
        recently active first, those idle for PRESSURE_IDLE_S until the rest fits."""
        now = time.monotonic()
        with self._lock:
            others = sorted((s for s in self._held if s is not session), key=lambda s: s.active_at)
            held = sum(self._held.values()) - self._held.get(session, 0)
            count = len(others) + 1
            out = []
            for s in others:
                idle = now - s.active_at
                tight = held + need > self.budget_bytes or count > most
                if idle >= self.idle_s or (tight and idle >= self.pressure_idle_s):
                    out.append(s)
                    held -= self._held.get(s, 0)
                    count -= 1
            return out


def _mib(n: int) -> str:
    return f"{n / MIB:,.1f}" if n < 10 * MIB else f"{n / MIB:,.0f}"


def _model_key(config: Any) -> tuple:
    return (config.model, config.device, config.dtype, config.tensor_parallel_size)


#: the process's account (limits.py reads its sizes from the environment)
BUDGET = SessionBudget(limits.MEMORY_BUDGET_MB * MIB, limits.MAX_SESSIONS,
                       limits.SESSION_IDLE_SECONDS, limits.SESSION_PRESSURE_IDLE_SECONDS)
