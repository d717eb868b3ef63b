"""One browser session: its engine config and operation log, and an engine rebuilt from them.

The op log is the source of truth (DESIGN principle 3): Back, Next, the timeline and Undo move a
cursor over it and replay; an operation done in the past drops the future, as in an editor. The
engine, which may hold the shared model, is never deep-copied: gr.State copies its initial value
for every new session, and `__deepcopy__` hands each one a fresh, empty session instead.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import weakref
import zlib
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks

MAX_TRACE_BYTES = 1 << 20  # an imported trace file or link
MAX_OPS = 2000  # operations per session: replaying more would make Back slow
#: models a session may choose; a public deployment must not load arbitrary ids or paths
ALLOWED_MODELS = ("default", "tiny-random", None)
#: sessions holding an engine at once (each real-model session holds its own KV pool)
MAX_SESSIONS = int(os.environ.get("PAGEDLAB_MAX_SESSIONS", "64"))

_live: weakref.WeakSet[Session] = weakref.WeakSet()  # sessions that hold an engine
_live_lock = threading.Lock()


class UserError(ValueError):
    """Something the user can fix; its message says how."""


class Session:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(model=None, block_size=4, num_gpu_blocks=32)
        self.ops: list[dict[str, Any]] = []
        self.pos = 0  # the engine shows ops[:pos]
        self._engine: LLMEngine | None = None
        self.lock = threading.Lock()  # a fast clicker cannot interleave two operations

    def __deepcopy__(self, memo: dict) -> Session:
        return Session(self.config)

    # On a ZeroGPU Space a handler runs in a forked GPU worker and its arguments and results are
    # pickled: a session travels as config + op log, and the worker rebuilds the engine by replay.
    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "ops": self.ops, "pos": self.pos}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])
        self.ops, self.pos = state["ops"], state["pos"]

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None or len(self._engine.trace) != self.pos:
            with _live_lock:
                if self not in _live and len(_live) >= MAX_SESSIONS:
                    raise UserError(f"PagedLab is serving {MAX_SESSIONS} sessions, the most it "
                                    "holds at once; try again in a minute")
                _live.add(self)
            self._engine = LLMEngine.replay(self.config, self.ops[: self.pos])
        return self._engine

    def close(self) -> None:
        """The browser session ended: let go of the engine (and its KV pool) now."""
        self._engine = None
        with _live_lock:
            _live.discard(self)


    def run(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run one engine operation at the cursor. A refused operation changes nothing."""
        with self.lock:
            if self.pos >= MAX_OPS:
                raise UserError(f"this session has {MAX_OPS} operations, the most it keeps; "
                                "press Reset or export the trace and start again")
            eng = self.engine
            try:
                result = getattr(eng, name)(*args, **kwargs)
            except (ValueError, OutOfBlocks) as err:  # all or nothing: the engine is as it was
                raise UserError(str(err)) from err
            except Exception:
                self._engine = None  # unexpected: rebuild from the log, which holds only successes
                raise
            self.ops = eng.trace
            self.pos = len(self.ops)
            return result

    def goto(self, pos: int) -> None:
        with self.lock:
            pos = max(0, min(int(pos), len(self.ops)))
            eng = self._engine
            if eng is not None and len(eng.trace) <= pos and eng.trace == self.ops[: len(eng.trace)]:
                for op in self.ops[len(eng.trace): pos]:  # forward: apply, no replay
                    eng._apply(dict(op))
            self.pos = pos

    def undo(self) -> None:
        with self.lock:
            self.ops = self.ops[: max(0, self.pos - 1)]
            self.pos = len(self.ops)

    def export(self) -> dict[str, Any]:
        return {"version": 1, "config": self.config.to_dict(), "ops": self.ops[: self.pos]}

    def to_link(self) -> str:
        raw = json.dumps(self.export(), separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")

    @classmethod
    def from_trace(cls, data: Any) -> Session:
        """A session from an exported trace (already parsed JSON). Replays it to validate."""
        if not isinstance(data, dict) or data.get("version") != 1 or "config" not in data:
            raise UserError("not a PagedLab trace: expected a JSON object with version 1, config, ops")
        try:
            config = EngineConfig.from_dict(data["config"])
        except (TypeError, ValueError) as err:
            raise UserError(f"the trace's engine config is invalid: {err}") from err
        if config.model not in ALLOWED_MODELS:
            raise UserError(f"this trace uses model {config.model!r}; PagedLab here runs only "
                            f"'default', 'tiny-random' or dry traces")
        ops = data.get("ops")
        if not isinstance(ops, list) or len(ops) > MAX_OPS:
            raise UserError(f"the trace's ops must be a list of at most {MAX_OPS} operations")
        session = cls(config)
        try:
            session._engine = LLMEngine.replay(config, ops)
        except (ValueError, OutOfBlocks) as err:
            raise UserError(f"the trace does not replay: {err}") from err
        session.ops = session._engine.trace
        session.pos = len(session.ops)
        return session

    @classmethod
    def from_bytes(cls, raw: bytes) -> Session:
        if len(raw) > MAX_TRACE_BYTES:
            raise UserError(f"the trace is {len(raw)} bytes; the most accepted is {MAX_TRACE_BYTES}")
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UserError(f"the trace is not valid JSON: {err}") from err
        return cls.from_trace(data)

    @classmethod
    def from_link(cls, token: str) -> Session:
        if len(token) > MAX_TRACE_BYTES:
            raise UserError("the link is too long")
        try:
            raw = zlib.decompressobj().decompress(
                base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)), MAX_TRACE_BYTES + 1)
        except (ValueError, zlib.error) as err:
            raise UserError(f"the link's trace is damaged: {err}") from err
        return cls.from_bytes(raw)


def live_sessions() -> int:
    """Sessions that hold an engine now."""
    return len(_live)
