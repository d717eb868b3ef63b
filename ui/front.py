"""What the main picture shows, whichever run that is: the Playground and Serving session's run
at its cursor (`SessionFront`), or the lesson in front at its page (`LessonFront`). The picture,
the inspector, the view under the picture, the shards and presenter mode all ask `front(session)`
and call the same methods on either: no flag chooses between the two runs, and the one place
that says which is in front is `session.front` (set when a tab is opened).

    shown = front(session)
    shown.values()           # the picture and the panels beside it (page.outs after the state)
    shown.snapshot()         # what the picture draws (None: a lesson not started)
    shown.engine_here()      # the engine in the state the picture shows (moved there)
"""

from __future__ import annotations

from typing import Any, Protocol

import gradio as gr

from engine import LLMEngine
from ui.lesson_pages import LessonSession, lesson_fit, lesson_values
from ui.render import render, session_figure, session_fit
from ui.run_views import lesson_view, request_seq, session_view
from ui.session import Session


class Front(Protocol):
    """What every part of the page may ask of the run in front of the picture."""

    session: Session  # the page's own state: the look (presenter mode, box) lives there

    def values(self) -> tuple: ...  # (picture, events, sequences, metrics, timeline, seq, status)

    def picture(self) -> Any: ...

    def snapshot(self) -> Any: ...  # None: nothing to draw yet (a lesson not started)

    def decode(self, token_ids: Any) -> str: ...

    @property
    def dry(self) -> bool: ...

    def engine_here(self) -> LLMEngine: ...

    def engine_ready(self) -> bool: ...

    selected_block: int | None

    def select_seq(self, seq_id: int) -> bool: ...

    view_choice: str

    def view_figure(self) -> Any: ...

    def view_key(self) -> tuple: ...

    def click_view(self, what: str, parts: list[str]) -> bool: ...

    def shards(self) -> tuple[Any, Any] | None: ...


def front(session: Session) -> Front:
    """The run in front of the picture, for `session`'s page."""
    shown = session.front
    return SessionFront(session) if shown is session else LessonFront(shown, session)


class SessionFront:
    """The Playground and Serving session's run, at its cursor."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def values(self) -> tuple:
        return render(self.session)

    def picture(self) -> Any:
        return session_figure(self.session)

    def snapshot(self) -> Any:
        return self.session.frame().snapshot

    def decode(self, token_ids: Any) -> str:
        return self.session.decode(token_ids)

    @property
    def dry(self) -> bool:
        return self.session.config.dry

    def engine_here(self) -> LLMEngine:
        return self.session.engine

    def engine_ready(self) -> bool:
        return self.session.engine_ready

    @property
    def selected_block(self) -> int | None:
        return self.session.selected_block

    @selected_block.setter
    def selected_block(self, b: int | None) -> None:
        self.session.selected_block = b

    def select_seq(self, seq_id: int) -> bool:
        if seq_id not in self.snapshot().sequences:
            return False
        self.session.selected_seq = seq_id
        return True

    @property
    def view_choice(self) -> str:
        return self.session.view_choice

    @view_choice.setter
    def view_choice(self, value: str) -> None:
        self.session.view_choice = value

    def view_figure(self) -> Any:
        return session_view(self.session, session_fit(self.session)[1])

    def view_key(self) -> tuple:
        s = self.session
        return ("session", s.pos, len(s.ops), s.open_request, s.selected_request, s.selected_block)

    def click_view(self, what: str, parts: list[str]) -> bool:
        """A click on the view under the picture: a timeline cell goes to its step and selects
        its request; a lane's label opens a group into its sequences (or closes it)."""
        s = self.session
        if not parts or not all(p.isdigit() for p in parts):
            return False
        rid = int(parts[0])
        if what == "cell" and len(parts) == 2:
            s.goto(min(int(parts[1]), len(s.ops)))
        elif what == "lane":
            s.open_request = None if s.open_request == rid else rid
        s.selected_request = rid
        seq = request_seq(s.frame().requests, rid)
        if seq is not None:
            s.selected_seq = seq
        return True

    def shards(self) -> tuple[Any, Any] | None:
        s = self.session
        if s.config.tensor_parallel_size == 1:
            return None
        frame = s.frame()
        return frame.snapshot, frame.info


class LessonFront:
    """The lesson in front, at the page on screen (nothing to draw before Start)."""

    def __init__(self, ls: LessonSession, session: Session) -> None:
        self.ls, self.session = ls, session

    @property
    def run(self) -> Any:
        return self.ls.run

    def values(self) -> tuple:
        if self.run is None:  # the picture keeps what it shows until a lesson starts
            return (*(gr.update() for _ in range(6)), "Lessons: pick a lesson and press Start")
        picture, events, seqs, metrics, status = lesson_values(self.ls, self.session.presenter,
                                                               self.session.box)
        return picture, events, seqs, metrics, gr.update(), gr.update(), status

    def picture(self) -> Any:
        if self.run is None:
            return None
        return lesson_fit(self.ls, self.session.presenter, self.session.box)[0]

    def snapshot(self) -> Any:
        return None if self.run is None else self.run.shown_snapshot

    def decode(self, token_ids: Any) -> str:
        return self.run.decode(token_ids)

    @property
    def dry(self) -> bool:
        return self.run is not None and self.run.config.dry

    def engine_here(self) -> LLMEngine:
        return self.run.engine_for(self.run.current)

    def engine_ready(self) -> bool:
        current = self.run.current
        return self.run.history.engine_ready(0 if current is None else current.pos)

    @property
    def selected_block(self) -> int | None:
        return self.ls.inspected

    @selected_block.setter
    def selected_block(self, b: int | None) -> None:
        self.ls.inspected = b

    def select_seq(self, seq_id: int) -> bool:
        return False  # a lesson's page acts by its own steps, not by clicks on its sequences

    @property
    def view_choice(self) -> str:
        return self.ls.view_choice

    @view_choice.setter
    def view_choice(self, value: str) -> None:
        self.ls.view_choice = value

    def view_figure(self) -> Any:
        if self.run is None:
            return None
        box = lesson_fit(self.ls, self.session.presenter, self.session.box)[1]
        return lesson_view(self.ls, self.session.presenter, box)

    def view_key(self) -> tuple:
        run = self.run
        return ("lesson", id(run), run and run.index, id(run and run.current), self.ls.inspected)

    def click_view(self, what: str, parts: list[str]) -> bool:
        return False  # a lesson's view follows its pages

    def shards(self) -> tuple[Any, Any] | None:
        run = self.run
        if run is None or run.config.tensor_parallel_size == 1:
            return None
        frame = run.frame_at(run.current)
        return frame.snapshot, frame.info

