"""One browser session: its engine config and operation log, and an engine rebuilt from them.

The op log is the source of truth (DESIGN principle 3): Back, Next, the timeline and Undo move a
cursor over it and replay; an operation done in the past drops the future, as in an editor. The
engine, which may hold the shared model, is never deep-copied: gr.State copies its initial value
for every new session, and `__deepcopy__` hands each one a fresh, empty session instead.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import traceback
import weakref
import zlib
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks, ops
from ui import limits
from ui.limits import UserError

# The limits this module enforces itself (ui/limits.py reads them from the environment); kept as
# module names because tests and older callers patch and import them from here.
MAX_TRACE_BYTES = limits.MAX_TRACE_BYTES
MAX_OPS = limits.MAX_OPS
ALLOWED_MODELS = limits.ALLOWED_MODELS
MAX_SESSIONS = limits.MAX_SESSIONS

_live: weakref.WeakSet[Session] = weakref.WeakSet()  # sessions that hold an engine
_live_lock = threading.Lock()


__all__ = ["MAX_OPS", "MAX_SESSIONS", "MAX_TRACE_BYTES", "Session", "UserError", "live_sessions"]


class Session:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(model=None, block_size=4, num_gpu_blocks=32)
        limits.check_config(self.config)
        self.ops: list[dict[str, Any]] = []
        self.pos = 0  # the engine shows ops[:pos]
        self._engine: LLMEngine | None = None
        self.lock = threading.Lock()  # a fast clicker cannot interleave two operations
        # what the picture outlines (a view choice, not an operation: not in the op log)
        self.selected_seq: int | None = None
        self.selected_block: int | None = None
        self.lesson_front = False  # the picture shows a lesson's engine, not this session's
        self.presenter = False  # large type in the picture (presenter mode)

    def __deepcopy__(self, memo: dict) -> Session:
        return Session(self.config)

    # On a ZeroGPU Space a handler runs in a forked GPU worker and its arguments and results are
    # pickled: a session travels as config + op log, and the worker rebuilds the engine by replay.
    # what the page shows besides the log (selection, lesson in front, presenter mode) travels too
    _VIEW = ("selected_seq", "selected_block", "lesson_front", "presenter")

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "ops": self.ops, "pos": self.pos,
                "view": {k: getattr(self, k) for k in self._VIEW}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])
        self.ops, self.pos = state["ops"], state["pos"]
        for k, v in state.get("view", {}).items():
            if k in self._VIEW:
                setattr(self, k, v)

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
        self._engine = None  # the engine holds no cycle: its KV pool goes with this reference
        with _live_lock:
            _live.discard(self)


    def run(self, op: ops.Op) -> Any:
        """Run one engine operation (engine/ops.py) at the cursor; returns its result. A refused
        operation changes nothing; so does one that fails unexpectedly: the engine is rebuilt
        from the log, which holds only operations that succeeded, and the user gets a message
        instead of a traceback."""
        with self.lock:
            if self.pos >= MAX_OPS:
                raise UserError(f"this session has {MAX_OPS} operations, the most it keeps; "
                                "press Reset or export the trace and start again")
            eng = self.engine
            self._check_op(op, eng, self.ops[: self.pos])
            try:
                result = eng.apply(op)
            except (ValueError, OutOfBlocks) as err:  # all or nothing: the engine is as it was
                raise UserError(str(err)) from err
            except Exception as err:
                # Not all-or-nothing any more: drop the engine; the next access replays the log.
                self._engine = None
                traceback.print_exc(file=sys.stderr)
                raise UserError(f"the {op.name} operation failed inside the engine "
                                f"({type(err).__name__}: {err}); the session is as it was "
                                "before it") from err
            self.ops = eng.trace
            self.pos = len(self.ops)
            return result

    @staticmethod
    def _check_op(op: ops.Op, eng: LLMEngine | None, before: list[dict[str, Any]]) -> None:
        """The per-session limits of ui/limits.py (a deployment's policy, on top of what the
        operation itself checks), for a click and for every op of a trace."""
        if isinstance(op, ops.AddSequence | ops.AddRequest):
            limits.check_prompt(op.prompt)
            if isinstance(op.prompt, str) and eng is not None:
                limits.check_prompt_tokens(len(eng.encode(op.prompt)))
            elif not isinstance(op.prompt, str):
                limits.check_prompt_tokens(len(op.prompt))
        if isinstance(op, ops.Append):
            count = op.n if op.token_ids is None else len(op.token_ids)
            if count > limits.MAX_APPEND:
                raise UserError(f"append adds at most {limits.MAX_APPEND} tokens at a time, "
                                f"got {count}")
        if isinstance(op, ops.AddRequest):
            done = sum(1 for o in before if isinstance(o, dict) and o.get("op") == "add_request")
            if done >= limits.MAX_REQUESTS:
                raise UserError(f"this session has added {done} requests, the most it may; "
                                "press Reset to start again")
            for key, most in (("max_tokens", limits.MAX_REQUEST_TOKENS), ("n", limits.MAX_SAMPLES),
                              ("beam_width", limits.MAX_BEAM_WIDTH)):
                value = getattr(op.params, key)
                if value > most:
                    raise UserError(f"{key} is at most {most} here, got {value}")

    def goto(self, pos: int) -> None:
        with self.lock:
            pos = max(0, min(int(pos), len(self.ops)))
            eng = self._engine
            if eng is not None and len(eng.trace) <= pos and eng.trace == self.ops[: len(eng.trace)]:
                for op in self.ops[len(eng.trace): pos]:  # forward: apply, no replay
                    eng.apply(op)
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
        records = data.get("ops")
        if not isinstance(records, list) or len(records) > MAX_OPS:
            raise UserError(f"the trace's ops must be a list of at most {MAX_OPS} operations")
        try:
            limits.check_config(config)
        except UserError as err:
            raise UserError(f"this trace cannot run here: {err}") from err
        session = cls(config)
        try:
            # the limits a click would meet, checked before anything runs (a trace could
            # otherwise ask for more than any session may do)
            probe = LLMEngine(config) if config.dry else None
            for i, record in enumerate(records):
                try:
                    op = ops.parse(record)
                except ValueError:
                    continue  # a malformed record: the replay below says what is wrong with it
                try:
                    cls._check_op(op, probe, records[:i])
                except UserError as err:
                    raise UserError(f"the trace's operation {i} exceeds a limit: {err}") from err
            session._engine = LLMEngine.replay(config, records)
        except (ValueError, OutOfBlocks) as err:
            if isinstance(err, UserError):
                raise
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
