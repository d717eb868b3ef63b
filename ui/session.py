"""One browser session of the Playground and Serving: its run (history/run_history.py: the config,
the op log, the cursor, recorded frames, checkpoints, the engine) and, beside it, what the page
shows of it: the selection, the view under the picture, the picture's box, presenter mode, and
which run the picture shows (`front`: this session, or the lesson in front).

The run's engine may hold the shared model and is never deep-copied: gr.State copies its initial
value for every new session, and `__deepcopy__` hands each one a fresh, empty session instead.
The engine counts in the sessions' memory budget (ui/session_budget.py) from the moment the run
builds it until the session lets go.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
import traceback
import weakref
import zlib
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks, ops
from history import Frame, RunHistory
from ui import limits
from ui.limits import UserError
from ui.picture_split import FitMemo
from ui.session_budget import BUDGET, reserve
from ui.tab_clock import TabClock

# The limits this module enforces itself (ui/limits.py reads them from the environment); kept as
# module names because tests and older callers patch and import them from here.
MAX_TRACE_BYTES = limits.MAX_TRACE_BYTES
MAX_OPS = limits.MAX_OPS
ALLOWED_MODELS = limits.ALLOWED_MODELS
MAX_SESSIONS = limits.MAX_SESSIONS
REPLACED = ("a new session began (Load, Reset or Apply) while this was on its way, so it was not "
            "done; do it again on the new one")


__all__ = ["MAX_OPS", "MAX_SESSIONS", "MAX_TRACE_BYTES", "Session", "UserError", "live_sessions"]


class Session:
    def __init__(self, config: EngineConfig | None = None) -> None:
        config = config or EngineConfig(model=None, block_size=4, num_gpu_blocks=32)
        limits.check_config(config)
        # the run reaches the budget through weak references: no cycle holds a dropped session's
        # engine until the garbage collector comes
        self.run_history = RunHistory(config, admit=_weakly(self._admit), hold=_weakly(self._hold))
        self.lock = threading.Lock()  # held while acting: a fast clicker cannot interleave two
        self.active_at = time.monotonic()  # the visitor's last action (idle sessions let go)
        self.notice = ""  # a sentence for the visitor's next action (ui/page.py shows it)
        self.warned = ""  # the last refusal ui/page.py's show() warned about (said once)
        # what the page shows of the run (not operations: not in the op log)
        self.selected_seq: int | None = None
        self.selected_block: int | None = None
        self.presenter = False  # large type in the picture (presenter mode)
        self.box: tuple[int, int] | None = None  # the page's room for the picture (ui/picture_box.py)
        self.box_at = 0  # when the page measured it (a later report wins)
        self.view_choice = "none"  # the view of the run under the picture (ui/views_panel.py)
        self.selected_request: int | None = None
        self.open_request: int | None = None  # a sample or beam group opened into its sequences
        self.fits = FitMemo()  # how the picture and the view under it shared the box, per state
        self.view_drawn: tuple | None = None  # what the view under the picture last followed
        self._front: Any = None  # a lesson in front of the picture (None: this session)
        self.front_clock = TabClock()  # the page's clock on the tab event in front
        # fresh() made a new session in this one's place (Load, Reset, Apply): an event of the
        # page that began on this one must not act on it or draw it (ui/page.py)
        self.replaced = False

    def __deepcopy__(self, memo: dict) -> Session:
        return Session(self.config)

    def fresh(self, config: EngineConfig | None = None) -> Session:
        """A new, empty session (Reset, new settings) that keeps how the page looks: presenter
        mode, the picture's box, the view under it, which run is in front."""
        new = Session(config or self.config)
        new.presenter, new.box, new.box_at = self.presenter, self.box, self.box_at
        new.view_choice = self.view_choice
        new._front = self._front
        # Gradio answers a page's events side by side: an action already under way on this
        # session ends first, and one that comes later finds it replaced and is refused (run)
        with self.lock:
            self.replaced = True
        self.close()
        return new

    # A session pickles as config + op log (and the page's choices); unpickled, it rebuilds its
    # engine by replay. (On ZeroGPU a GPU call gets plain data instead: ui/gpu_jobs.py.)
    _LOOK = ("selected_seq", "selected_block", "presenter", "box", "view_choice")

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "ops": self.ops, "pos": self.pos,
                "look": {k: getattr(self, k) for k in self._LOOK}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])
        self.run_history.log.extend(state["ops"])
        self.run_history.pos = state["pos"]
        for k, v in state.get("look", {}).items():
            if k in self._LOOK:
                setattr(self, k, v)

    @property
    def front(self) -> Any:
        """What the picture shows: this session, or the lesson in front (ui/front.py)."""
        return self if self._front is None else self._front

    @front.setter
    def front(self, shown: Any) -> None:
        self._front = None if shown is self else shown  # never a cycle through itself

    def bring_front(self, shown: Any, at: float | None) -> bool:
        """A tab came to the front and shows `shown` (this session or a lesson), as the page
        said at `at` (its clock, ms; None: no clock, as from an API call). Gradio handles a
        page's quick tab clicks side by side: one older than the last applied is stale, and
        changes nothing (False)."""
        if not self.front_clock.admit(at):
            return False
        self.front = shown
        return True

    # ---- the run ----------------------------------------------------------------------------------

    @property
    def config(self) -> EngineConfig:
        return self.run_history.config

    @property
    def ops(self) -> list[dict[str, Any]]:
        """The op log (the run's own list: read it, act through `run`)."""
        return self.run_history.log

    @property
    def pos(self) -> int:
        return self.run_history.pos

    @property
    def engine(self) -> LLMEngine:
        """The engine at the cursor, moved there if it is elsewhere."""
        return self.run_history.engine

    @property
    def engine_ready(self) -> bool:
        """Whether the engine is at the cursor now (asking for it costs nothing)."""
        return self.run_history.engine_ready()

    def behind(self) -> list[dict[str, Any]]:
        """The operations the engine would apply to reach the cursor."""
        return self.run_history.behind()

    def frame(self) -> Frame:
        """What the page draws at the cursor: recorded, or recorded now."""
        return self.run_history.frame()

    def recorded(self, pos: int) -> Frame | None:
        return self.run_history.recorded(pos)

    def prefix_tree(self, frame: Frame) -> Any:
        return self.run_history.prefix_tree(frame)

    def decode(self, token_ids: Any) -> str:
        return self.run_history.decode(token_ids)

    def run(self, op: ops.Op) -> Any:
        """Run one engine operation (engine/ops.py) at the cursor; returns its result. A refused
        operation changes nothing; so does one that fails unexpectedly (the run rebuilds its
        engine from the log, which holds only operations that succeeded), and the visitor gets
        a message instead of a traceback."""
        with self.lock:
            self.refuse_if_replaced()
            self.active_at = time.monotonic()
            BUDGET.sweep()  # sessions idle past the limit let go, whatever the pressure
            if self.pos >= MAX_OPS:
                raise UserError(f"this session has {MAX_OPS} operations, the most it keeps; "
                                "press Reset or export the trace and start again")
            self.check_op(op, self.engine, self.ops[: self.pos])
            try:
                return self.run_history.act(op)
            except (ValueError, OutOfBlocks) as err:  # all or nothing: the engine is as it was
                raise UserError(str(err)) from err
            except Exception as err:
                traceback.print_exc(file=sys.stderr)
                raise UserError(f"the {op.name} operation failed inside the engine "
                                f"({type(err).__name__}: {err}); the session is as it was "
                                "before it") from err

    def refuse_if_replaced(self) -> None:
        if self.replaced:
            raise UserError(REPLACED)

    #: the per-session limits of ui/limits.py, for a click and for every op of a trace
    check_op = staticmethod(limits.check_op)

    def goto(self, pos: int) -> None:
        """Move the cursor: the page draws the frame recorded there; the engine stays where it
        is until an operation (or a K/V read) needs it at the cursor."""
        self.active_at = time.monotonic()
        self.run_history.goto(pos)

    def undo(self) -> None:
        self.run_history.undo()

    def adopt(self, base: int, records: list[dict[str, Any]], frames: dict[int, Frame]) -> None:
        """Take on what a GPU call did from position `base` (ui/gpu_jobs.py)."""
        with self.lock:
            self.refuse_if_replaced()
            try:
                self.run_history.adopt(base, records, frames, elsewhere="the GPU")
            except ValueError as err:
                raise UserError(str(err)) from err
            self.active_at = time.monotonic()

    def take_notice(self) -> str:
        notice, self.notice = self.notice or self.run_history.take_notice(), ""
        return notice

    # ---- the engine's memory ------------------------------------------------------------------------

    def _admit(self, config: EngineConfig) -> None:
        """Before the run builds an engine: room for it in the sessions' budget, or a refusal."""
        BUDGET.sweep()
        BUDGET.admit(self, reserve(config, BUDGET.block_bytes(config)), MAX_SESSIONS)

    def _hold(self, eng: LLMEngine) -> None:
        """The run built `eng`: counted at its exact size (the first engine of a model is known
        only once built); refused, the run closes it."""
        info = eng.engine_info()
        BUDGET.learn(eng.config, info)
        BUDGET.admit(self, reserve(eng.config, info.get("kv bytes per block")), MAX_SESSIONS)

    def close(self) -> None:
        """The browser session ended: let go of the engine (and its KV pool) now."""
        self.run_history.let_go()
        BUDGET.release(self)

    def let_go(self, idle: bool = False) -> bool:
        """Let go of the engine to make room (ui/session_budget.py): the log and the frames stay,
        and the next action rebuilds the engine from the log. Not while the session is acting."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            minutes = (time.monotonic() - self.active_at) / 60
            held = self.run_history.let_go()
            BUDGET.release(self)
            if held and idle:
                self.notice = (f"This session was idle for {minutes:.0f} minutes, so its engine "
                               "was let go to make room for other visitors; it is rebuilt "
                               f"from its log ({len(self.ops)} operations) when you act on it")
            return held
        finally:
            self.lock.release()

    # ---- traces and links ------------------------------------------------------------------------------

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
        cls._check_trace_limits(config, records)
        session = cls(config)
        try:
            session.run_history.replay(records)
        except (ValueError, OutOfBlocks) as err:
            session.close()
            i = len(session.ops)
            raise UserError(f"the trace does not replay: operation {i} ({records[i]!r:.80}) "
                            f"failed: {err}") from err
        return session

    @classmethod
    def _check_trace_limits(cls, config: EngineConfig, records: list[Any]) -> None:
        """The limits a click would meet, checked on every operation before anything runs (a
        trace could otherwise ask for more than any session may do)."""
        probe = LLMEngine(config) if config.dry else None
        for i, record in enumerate(records):
            try:
                op = ops.parse(record)
            except ValueError:
                continue  # a malformed record: the replay says what is wrong with it
            try:
                cls.check_op(op, probe, records[:i])
            except UserError as err:
                raise UserError(f"the trace's operation {i} exceeds a limit: {err}") from err

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


def _weakly(method: Any) -> Any:
    """`method`, called through a weak reference to its object (a no-op once it is gone)."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)
    return call


def live_sessions() -> int:
    """Sessions that hold an engine now."""
    return len(BUDGET)
