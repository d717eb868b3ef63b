"""What every panel of the page shares: the session state, the one main picture and the panels
beside it, and how a session becomes their values (`show`). Panels wire their own callbacks
against a Page; their outputs are `page.outs`, always in this order:
[state, plot, events, sequences, metrics, timeline, sequence dropdown, status]."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from typing import Any

import gradio as gr

from engine.ops import OpError
from ui.gpu import gpu_task
from ui.refusal import failed, refused
from ui.render import render
from ui.session import Session, UserError

# Progress and errors show on the status line only: by default Gradio marks every output of a
# failed event with an "Error" badge and blanks the main figure, though a refused operation
# changes nothing.
ON_STATUS = "show_progress_on"


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
    lesson: Any = None  # the Lessons tab's state (its engine is the picture's when in front)

    @property
    def outs(self) -> list:
        return [self.state, self.plot, self.events, self.seqs, self.metrics, self.timeline,
                self.seq, self.status]

    @property
    def quiet(self) -> dict[str, Any]:
        return {ON_STATUS: [self.status]}


def show(session: Session) -> tuple:
    return (session, *render(session))


def guard(fn):
    """Turn a UserError into a gr.Error (a message box) and one log line, keeping the session
    unchanged; an unexpected exception's traceback goes to the log. On a ZeroGPU Space the
    handler runs on the GPU (ui/gpu.py)."""
    fn = gpu_task(fn)

    def wrapped(*args: Any) -> Any:
        try:
            return fn(*args)
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
