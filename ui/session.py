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
import time
import traceback
import zlib
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks, ops
from ui import limits
from ui.limits import UserError
from ui.picture_split import FitMemo
from ui.recorded_view import View
from ui.session_budget import BUDGET, reserve

# The limits this module enforces itself (ui/limits.py reads them from the environment); kept as
# module names because tests and older callers patch and import them from here.
MAX_TRACE_BYTES = limits.MAX_TRACE_BYTES
MAX_OPS = limits.MAX_OPS
ALLOWED_MODELS = limits.ALLOWED_MODELS
MAX_SESSIONS = limits.MAX_SESSIONS


__all__ = ["MAX_OPS", "MAX_SESSIONS", "MAX_TRACE_BYTES", "Session", "UserError", "View",
           "live_sessions"]


#: a checkpoint every CHECKPOINT_EVERY operations at first; past MAX_CHECKPOINTS the spacing
#: doubles (every other one goes), so a long log keeps few, and a rebuild replays at most about
#: MAX_OPS / MAX_CHECKPOINTS * 2 operations
CHECKPOINT_EVERY = 8
MAX_CHECKPOINTS = 12


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
        self.active_at = time.monotonic()  # the visitor's last action (idle sessions let go)
        self.notice = ""  # a sentence for the visitor's next action (ui/page.py shows it)
        self.warned = ""  # the last refusal ui/page.py's show() warned about (said once)
        self._adopted: set[int] = set()  # positions whose views a GPU call recorded
        self._pool_bytes = 0  # the engine's KV pool, swap space and CPU tier (caps checkpoints)
        self.presenter = False  # large type in the picture (presenter mode)
        self.box: tuple[int, int] | None = None  # the page's room for the picture (ui/picture_box.py)
        self.box_at = 0  # when the page measured it (a later report wins)
        # the view of the run under the picture (ui/views_panel.py) and what it selects
        self.view_choice = "none"
        self.selected_request: int | None = None
        self.open_request: int | None = None  # a sample or beam group opened into its sequences
        self.fits = FitMemo()  # how the picture and the view under it shared the box, per state
        self.view_drawn: tuple | None = None  # what the view under the picture last followed

    def __deepcopy__(self, memo: dict) -> Session:
        return Session(self.config)

    def fresh(self, config: EngineConfig | None = None) -> Session:
        """A new, empty session (Reset, new settings) that keeps how the page looks: presenter
        mode, the picture's box, which engine is in front."""
        new = Session(config or self.config)
        new.presenter, new.box, new.lesson_front = self.presenter, self.box, self.lesson_front
        new.view_choice = self.view_choice
        return new

    # A session pickles as config + op log (and what the page shows besides: selection, lesson in
    # front, presenter mode); unpickled, it rebuilds its engine by replay. (On ZeroGPU a GPU call
    # gets plain data instead, and its views come back: ui/gpu_jobs.py.)
    _VIEW = ("selected_seq", "selected_block", "lesson_front", "presenter", "box", "view_choice")

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

    def behind(self) -> list[dict[str, Any]]:
        """The operations the engine here would apply to reach the cursor: from where it is,
        from its nearest checkpoint after a Back, the whole log without an engine."""
        if self._engine is None:
            return self.ops[: self.pos]
        if self._at <= self.pos:
            return self.ops[self._at: self.pos]
        return self.ops[max((p for p in self._checkpoints if p <= self.pos), default=0): self.pos]

    def view(self) -> View:
        """What the page draws at the cursor: recorded, or recorded now."""
        view = self._views.get(self.pos)
        if view is None:
            view = self._views[self.pos] = View.of(self.engine)
        return view

    def recorded(self, pos: int) -> View | None:
        """The view recorded at position `pos` of the log, if there is one (no engine work)."""
        return self._views.get(pos)

    def prefix_tree(self, view: View) -> Any:
        """The prefix cache of a recorded view as a tree, from the engine the session holds
        wherever it is in the log (what it knows of the hash chain holds at every point)."""
        if self._engine is None:
            self._build_engine()
        return self._engine.prefix_tree(view.snapshot)

    def decode(self, token_ids: Any) -> str:
        """Token ids as text (the tokenizer's: the same at every point of the log, so an engine
        anywhere in it will do, and drawing a view never replays)."""
        if self._engine is None:
            self._build_engine()
        return self._engine.decode(token_ids)

    def _build_engine(self) -> None:
        """A new engine at the log's start, counted in the sessions' memory budget."""
        BUDGET.sweep()
        BUDGET.admit(self, reserve(self.config, BUDGET.block_bytes(self.config)), MAX_SESSIONS)
        self._hold(LLMEngine(self.config))
        self._at = 0
        self._note(self._engine)

    def _hold(self, eng: LLMEngine) -> None:
        """Hold `eng`, counted at its exact size (the first engine of a model is known only once
        it is built); refused, it is closed at once."""
        info = eng.engine_info()
        BUDGET.learn(self.config, info)
        need = reserve(self.config, info.get("kv bytes per block"))
        try:
            BUDGET.admit(self, need, MAX_SESSIONS)
        except UserError:
            eng.close()
            raise
        self._engine, self._pool_bytes = eng, need // 2

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
            self._build_engine()
            eng = self._engine
        for op in self.ops[self._at: pos]:
            eng.apply(op)
            self._at += 1
            if self._at in self._adopted:
                self._check_adopted(eng)
            self._note(eng)

    def _check_adopted(self, eng: LLMEngine) -> None:
        """The engine here has replayed up to a view a GPU call recorded: the same bookkeeping
        (tokens, tables, blocks), or, where the two devices' rounding chose another token, the
        page goes on from this engine's views and says so."""
        if self._views[self._at].snapshot == eng.snapshot():
            return
        stale = {p for p in self._adopted if p >= self._at}
        self._views = {p: v for p, v in self._views.items() if p not in stale}
        self._adopted -= stale
        self.notice = (f"Replayed here on the CPU, operation {self._at} chose other tokens than "
                       "the GPU did (the two round differently); the page now shows the CPU's run")

    def _note(self, eng: LLMEngine) -> None:
        """Record the view at the engine's point, and a checkpoint where one is due."""
        at = self._at
        if at not in self._views:
            self._views[at] = View.of(eng)
        if at % self._every == 0 and at not in self._checkpoints:
            checkpoint = eng.checkpoint()
            if checkpoint is not None:
                self._checkpoints[at] = checkpoint
            # at most MAX_CHECKPOINTS, holding at most the pool's own bytes (the budget counts a
            # session at twice its pool): past either, every other one goes
            while len(self._checkpoints) > 1 and (len(self._checkpoints) > MAX_CHECKPOINTS or sum(
                    c.kv_bytes for c in self._checkpoints.values()) > self._pool_bytes):
                self._every *= 2
                self._checkpoints = {p: c for p, c in self._checkpoints.items()
                                     if p % self._every == 0}

    def _drop_future(self, pos: int) -> None:
        """The log now ends at pos: what was recorded after it is gone."""
        self.ops = self.ops[:pos]
        self._adopted = {p for p in self._adopted if p <= pos}
        self._views = {p: v for p, v in self._views.items() if p <= pos}
        self._checkpoints = {p: c for p, c in self._checkpoints.items() if p <= pos}

    def close(self) -> None:
        """The browser session ended: let go of the engine (and its KV pool) now."""
        self._engine = None  # the engine holds no cycle: its KV pool goes with this reference
        self._checkpoints, self._at = {}, 0  # their saved K/V go too
        BUDGET.release(self)

    def let_go(self, idle: bool = False) -> bool:
        """Let go of the engine to make room (ui/session_budget.py): the log and the views stay,
        and the next action rebuilds the engine from the log. Not while the session is acting."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            held = self._engine is not None
            minutes = (time.monotonic() - self.active_at) / 60
            self.close()
            if held and idle:
                self.notice = (f"This session was idle for {minutes:.0f} minutes, so its engine "
                               "was let go to make room for other visitors; it is rebuilt "
                               f"from its log ({len(self.ops)} operations) when you act on it")
            return held
        finally:
            self.lock.release()

    def adopt(self, base: int, records: list[dict[str, Any]], views: dict[int, View]) -> None:
        """Take on what a GPU call did from position `base` (ui/gpu_jobs.py): its operations and
        the views it recorded. Back, Next and the timeline draw those; the engine here replays
        the operations only when the visitor acts on it, checked against the views."""
        with self.lock:
            if base != self.pos or base > len(self.ops):
                raise UserError("this session moved while the GPU ran; press the button again")
            if self._engine is not None and self._at > base:  # after a Back: to base first
                self._move_engine(base)
            self._drop_future(base)
            self.ops.extend(records)
            self._views.update(views)
            self._adopted.update(views)
            self.pos = len(self.ops)
            self.active_at = time.monotonic()

    def take_notice(self) -> str:
        notice, self.notice = self.notice, ""
        return notice


    def run(self, op: ops.Op) -> Any:
        """Run one engine operation (engine/ops.py) at the cursor; returns its result. A refused
        operation changes nothing; so does one that fails unexpectedly: the engine is rebuilt
        from the log, which holds only operations that succeeded, and the user gets a message
        instead of a traceback."""
        with self.lock:
            self.active_at = time.monotonic()
            BUDGET.sweep()  # sessions idle past the limit let go, whatever the pressure
            if self.pos >= MAX_OPS:
                raise UserError(f"this session has {MAX_OPS} operations, the most it keeps; "
                                "press Reset or export the trace and start again")
            eng = self.engine
            self.check_op(op, eng, self.ops[: self.pos])
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

    #: the per-session limits of ui/limits.py, for a click and for every op of a trace
    check_op = staticmethod(limits.check_op)

    def goto(self, pos: int) -> None:
        """Move the cursor: the page draws the view recorded there; the engine stays where it is
        until an operation (or a K/V read) needs it at the cursor."""
        with self.lock:
            self.active_at = time.monotonic()
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
                    cls.check_op(op, probe, records[:i])
                except UserError as err:
                    raise UserError(f"the trace's operation {i} exceeds a limit: {err}") from err
            engine = LLMEngine.replay(config, records)
        except (ValueError, OutOfBlocks) as err:
            if isinstance(err, UserError):
                raise
            raise UserError(f"the trace does not replay: {err}") from err
        session._hold(engine)
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
    return len(BUDGET)
