"""One browser session: its engine config and operation log, an engine at the log's cursor, and
what the page drew at every point of the log.

The op log is the source of truth (DESIGN principle 3). Back, Next and the timeline move a cursor
over it and draw the VIEW recorded when the engine was at that point (its snapshot, events,
requests: small), with no engine work. The engine moves only when the user acts from a past
point (editor semantics: the future is dropped) or asks it for K/V there, and then from the
nearest CHECKPOINT at or before that point (engine/checkpoint.py), not from the start. The engine,
which may hold the shared model, is never deep-copied: gr.State copies its initial value for
every new session, and `__deepcopy__` hands each one a fresh, empty session instead.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import traceback
import weakref
import zlib
from dataclasses import dataclass
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


#: a checkpoint every CHECKPOINT_EVERY operations at first; past MAX_CHECKPOINTS the spacing
#: doubles (every other one goes), so a long log keeps few, and a rebuild replays at most about
#: MAX_OPS / MAX_CHECKPOINTS * 2 operations
CHECKPOINT_EVERY = 8
MAX_CHECKPOINTS = 12


@dataclass(frozen=True)
class View:
    """What the page draws at one point of the log (ui/render.py), recorded when the engine was
    there: the engine's own snapshot and events, and its requests (plain data)."""

    snapshot: Any
    events: tuple
    requests: tuple
    finished: tuple
    info: dict[str, Any]
    max_model_len: int

    @classmethod
    def of(cls, eng: LLMEngine) -> View:
        return cls(eng.snapshot(), tuple(eng.last_events), tuple(eng.requests()),
                   tuple(eng.finished_requests()), eng.engine_info(), eng.max_model_len)


class Session:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(model=None, block_size=4, num_gpu_blocks=32)
        limits.check_config(self.config)
        self.ops: list[dict[str, Any]] = []
        self.pos = 0  # the engine shows ops[:pos]
        self._engine: LLMEngine | None = None
        self._at = 0  # the engine shows ops[:_at] (it may be ahead of the cursor after Back)
        self._views: dict[int, View] = {}  # position -> what the page draws there
        self._checkpoints: dict[int, Any] = {}  # position -> engine checkpoint
        self._every = CHECKPOINT_EVERY
        self.lock = threading.Lock()  # a fast clicker cannot interleave two operations
        # what the picture outlines (a view choice, not an operation: not in the op log)
        self.selected_seq: int | None = None
        self.selected_block: int | None = None
        self.lesson_front = False  # the picture shows a lesson's engine, not this session's
        self.presenter = False  # large type in the picture (presenter mode)
        self.box: tuple[int, int] | None = None  # the page's room for the picture (ui/picture_box.py)

    def __deepcopy__(self, memo: dict) -> Session:
        return Session(self.config)

    def fresh(self, config: EngineConfig | None = None) -> Session:
        """A new, empty session (Reset, new settings) that keeps how the page looks: presenter
        mode, the picture's box, which engine is in front."""
        new = Session(config or self.config)
        new.presenter, new.box, new.lesson_front = self.presenter, self.box, self.lesson_front
        return new

    # On a ZeroGPU Space a handler runs in a forked GPU worker and its arguments and results are
    # pickled: a session travels as config + op log, and the worker rebuilds the engine by replay.
    # what the page shows besides the log (selection, lesson in front, presenter mode) travels too
    _VIEW = ("selected_seq", "selected_block", "lesson_front", "presenter", "box")

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
        """The engine at the cursor, moved there if it is elsewhere."""
        if self._engine is None or self._at != self.pos:
            self._move_engine(self.pos)
        return self._engine

    @property
    def engine_ready(self) -> bool:
        """Whether the engine is at the cursor now (asking for it costs nothing)."""
        return self._engine is not None and self._at == self.pos

    def view(self) -> View:
        """What the page draws at the cursor: recorded, or recorded now."""
        view = self._views.get(self.pos)
        if view is None:
            view = self._views[self.pos] = View.of(self.engine)
        return view

    def decode(self, token_ids: Any) -> str:
        """Token ids as text (the tokenizer's: the same at every point of the log)."""
        return (self._engine or self.engine).decode(token_ids)

    def _move_engine(self, pos: int) -> None:
        """Bring the engine to ops[:pos]: forward by applying the ops in between, back from the
        nearest checkpoint at or before pos, or, without an engine, by replaying the log."""
        eng = self._engine
        if eng is not None and self._at > pos:
            start = max((p for p in self._checkpoints if p <= pos), default=None)
            if start is None:
                eng = None
            else:
                eng.restore(self._checkpoints[start])
                self._at = start
        if eng is None:
            self._register()
            eng, self._at = LLMEngine(self.config), 0
            self._engine = eng
            self._note(eng)
        for op in self.ops[self._at: pos]:
            eng.apply(op)
            self._at += 1
            self._note(eng)

    def _note(self, eng: LLMEngine) -> None:
        """Record the view at the engine's point, and a checkpoint where one is due."""
        at = self._at
        if at not in self._views:
            self._views[at] = View.of(eng)
        if at % self._every == 0 and at not in self._checkpoints:
            checkpoint = eng.checkpoint()
            if checkpoint is not None:
                self._checkpoints[at] = checkpoint
            if len(self._checkpoints) > MAX_CHECKPOINTS:
                self._every *= 2
                self._checkpoints = {p: c for p, c in self._checkpoints.items()
                                     if p % self._every == 0}

    def _register(self) -> None:
        with _live_lock:
            if self not in _live and len(_live) >= MAX_SESSIONS:
                raise UserError(f"PagedLab is serving {MAX_SESSIONS} sessions, the most it "
                                "holds at once; try again in a minute")
            _live.add(self)

    def _drop_future(self, pos: int) -> None:
        """The log now ends at pos: what was recorded after it is gone."""
        self.ops = self.ops[:pos]
        self._views = {p: v for p, v in self._views.items() if p <= pos}
        self._checkpoints = {p: c for p, c in self._checkpoints.items() if p <= pos}

    def close(self) -> None:
        """The browser session ended: let go of the engine (and its KV pool) now."""
        self._engine = None  # the engine holds no cycle: its KV pool goes with this reference
        self._checkpoints, self._at = {}, 0  # their saved K/V go too
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
                # Not all-or-nothing any more: drop the engine; the next access rebuilds it.
                self._engine, self._checkpoints, self._at = None, {}, 0
                traceback.print_exc(file=sys.stderr)
                raise UserError(f"the {op.name} operation failed inside the engine "
                                f"({type(err).__name__}: {err}); the session is as it was "
                                "before it") from err
            self._drop_future(self.pos)
            self.ops.append(eng.trace[-1])
            self.pos = self._at = len(self.ops)
            self._note(eng)
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
        """Move the cursor: the page draws the view recorded there; the engine stays where it is
        until an operation (or a K/V read) needs it at the cursor."""
        with self.lock:
            self.pos = max(0, min(int(pos), len(self.ops)))
            if self.pos not in self._views:  # e.g. a session rebuilt from its pickled log
                self._move_engine(self.pos)

    def undo(self) -> None:
        with self.lock:
            self.pos = max(0, self.pos - 1)
            self._drop_future(self.pos)

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
                            f"'default', 'tiny-random', 'tiny-hybrid' or dry traces")
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
            engine = LLMEngine.replay(config, records)
        except (ValueError, OutOfBlocks) as err:
            if isinstance(err, UserError):
                raise
            raise UserError(f"the trace does not replay: {err}") from err
        session._engine = engine
        session.ops = engine.trace
        session.pos = session._at = len(session.ops)
        session._note(engine)
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
