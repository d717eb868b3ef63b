"""What every panel of the page shares: the session state, the one main picture and the panels
beside it, and how a session becomes their values (`show`). Panels wire their own callbacks
against a Page; their outputs are `page.outs`, always in this order:
[state, plot, events, sequences, metrics, timeline, sequence dropdown, status]."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from engine.ops import OpError
from ui.front import front
from ui.gpu_jobs import GpuClock
from ui.refusal import failed, refused
from ui.session import REPLACED, Session, UserError

# Progress and errors show on the status line only: by default Gradio marks every output of a
# failed event with an "Error" badge and blanks the main figure, though a refused operation
# changes nothing.
ON_STATUS = "show_progress_on"
# The events of the hidden buttons that the page's script presses (ui/motion.js, ui/views.js): a
# press while the last event is pending runs after it, where Gradio's default drops it (a
# follow pressed during the page before's left the view under the picture that page's)
SCRIPTED = {"trigger_mode": "always_last"}


@dataclass
class Follower:
    """A part of the page redrawn when the status line changes: fn(*inputs) -> outputs' values
    (a tuple, or the one value of a single output)."""

    fn: Callable[..., Any]
    inputs: list
    outputs: list


@dataclass
class Page:
    device: str
    state: Any = None
    plot: Any = None
    events: Any = None
    seqs: Any = None
    metrics: Any = None
    timeline: Any = None
    seq: Any = None
    status: Any = None
    follow: Any = None  # a hidden button: the status line's text changed (ui/motion.js)
    followers: list[Follower] = field(default_factory=list)  # what `follow` redraws (wire_follow)
    lesson: Any = None  # the Lessons tab's state (ui/lesson_pages.py: a LessonSession)
    gpu: GpuClock = field(default_factory=GpuClock)  # where serving work runs on ZeroGPU

    @property
    def outs(self) -> list:
        return [self.state, self.plot, self.events, self.seqs, self.metrics, self.timeline,
                self.seq, self.status]

    @property
    def quiet(self) -> dict[str, Any]:
        return {ON_STATUS: [self.status]}

    def in_front(self, session: Session, shown: Any, at: float | None, draw: Callable[[], tuple],
                 outputs: list) -> tuple:
        """A tab's answer: `shown` (the session or a lesson) in front, drawn, unless a later tab
        event overtook the one sent at `at`, or a Load, Reset or Apply replaced the session while
        it was drawn: then nothing changes on the page. It never writes the session itself
        (bringing a run to the front changes it in place): a late answer wrote back the session
        that a Load had just replaced, and the visitor's workload was gone."""
        nothing = tuple(gr.skip() for _ in outputs)
        if not session.bring_front(shown, at):
            return nothing
        out = draw()  # nothing, through show(), for a session replaced already
        if session.replaced or not session.front_clock.still_latest(at):
            return nothing
        return tuple(gr.skip() if o is self.state else v for o, v in zip(outputs, out, strict=True))


def wire_follow(page: Page) -> None:
    """Every follower hangs on ONE event of `follow`: each event costs the page Gradio's
    loading-status work (a deep copy of its components' props) and a round trip; with three
    events a move, a phone's renderer spent ~20% more CPU over 41 Backs (36 s against 30)."""
    inputs = list(dict.fromkeys(c for f in page.followers for c in f.inputs))
    outputs = [c for f in page.followers for c in f.outputs]

    def on_follow(*values: Any) -> tuple:
        given = dict(zip(map(id, inputs), values, strict=True))
        out: list[Any] = []
        for f in page.followers:
            try:
                got = f.fn(*(given[id(c)] for c in f.inputs))
            except Exception:  # noqa: BLE001 (one follower's failure must not stop the others)
                traceback.print_exc(file=sys.stderr)
                out.extend(gr.skip() for _ in f.outputs)
                continue
            out.extend(got if len(f.outputs) > 1 else (got,))
        return tuple(out)

    page.follow.click(on_follow, inputs, outputs, show_progress="hidden", **SCRIPTED)


def show(session: Session) -> tuple:
    """The values for page.outs: the session, then the run in front of the picture (the
    session's own, or a lesson's: ui/front.py). A session that cannot hold an engine now (the
    sessions' memory budget is full: ui/session_budget.py) gets its message as a warning and a
    page left as it was, from every handler (page load and tab switches are not guarded). A
    session a Load, Reset or Apply has replaced draws nothing: its answer is late, and writing it
    back would undo the new one."""
    if session.replaced:
        return tuple(gr.skip() for _ in range(8))
    try:
        values = front(session).values()
    except UserError as err:
        if session.warned != str(err):  # once, though page load redraws more than once
            session.warned = str(err)
            gr.Warning(str(err), duration=30)
        return (session, *(gr.update() for _ in range(7)))
    session.warned = ""
    return (session, *values)


def guard(fn):
    """Turn a UserError into a gr.Error (a message box) and one log line, keeping the session
    unchanged; an unexpected exception's traceback goes to the log. What a session has to tell
    its visitor (an idle engine let go, a GPU run cut short) shows as a note. Handlers run in
    this process, on ZeroGPU too (its GPU work goes through ui/gpu_jobs.py)."""

    def wrapped(*args: Any) -> Any:
        try:
            if _replaced(args):  # a Load, Reset or Apply came first: nothing to act on
                raise UserError(REPLACED)
            out = _with_notices(fn, args)
            if _replaced(args, out):  # ... or came while this ran: its answer would undo it
                raise UserError(REPLACED)
            return out
        except (UserError, OpError) as err:  # OpError: an operation's argument (engine/ops.py)
            raise refused(fn.__name__, str(err)) from err
        except gr.Error:
            raise
        except Exception as err:  # a bug must reach the log, and the user a sentence, not a trace
            traceback.print_exc(file=sys.stderr)
            # the op log only ever holds operations that succeeded, so Undo and Reset still work
            raise failed(f"something went wrong ({type(err).__name__}); this session's "
                         "operation log is intact (Undo and Reset work); please report this") from err
    wrapped.__name__ = fn.__name__
    return wrapped


def _replaced(args: tuple, out: Any = None) -> bool:
    """Whether the session a handler answers with (the one it returns, else the one it was
    given) has been replaced by a new one since the event began."""
    returned = [v for v in (out if isinstance(out, tuple) else (out,)) if isinstance(v, Session)]
    return any(s.replaced for s in returned or [a for a in args if isinstance(a, Session)])


def _with_notices(fn, args: tuple) -> Any:
    """Run the handler; then show each session's notice (the one it was given, and the one it
    returns) as a note beside the page."""
    out = fn(*args)
    for value in (*args, *(out if isinstance(out, tuple) else (out,))):
        if isinstance(value, Session) and (notice := value.take_notice()):
            gr.Info(notice, duration=15)
    return out
