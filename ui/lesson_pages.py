"""A learner's lesson in the page: the run being played (lessons/runner.py), what the page shows of
it beside the run (the block the inspector shows, the view under the picture), and how a page of
it is drawn into the one main picture and the panels beside it. No widgets here: the Lessons tab
(ui/lesson_player.py) builds those; ui/front.py puts a lesson in front of the picture."""

from __future__ import annotations

import inspect
import re
from typing import Any

from lessons import LessonRun
from lessons.page_text import keyed_markdown, page_markdown
from ui import lesson_ask
from ui.picture_split import FitMemo, fit_split
from ui.render import model_status, token_text
from ui.run_views import lesson_slide_choice, lesson_view
from viz import event_log_markdown, metrics_html, pool_figure, sequences_html


class LessonSession:
    """A lesson run per browser session, and what the page shows of it; never deep-copied (it
    holds an engine)."""

    def __init__(self) -> None:
        self.run: LessonRun | None = None
        self.inspected: int | None = None  # the block the inspector shows
        self.view_choice = "none"  # the view of the run under the picture
        self.fits = FitMemo()  # how the picture and the view under it shared the box, per page

    def __deepcopy__(self, memo: dict) -> LessonSession:
        return LessonSession()

    def play(self, run: LessonRun) -> None:
        """A lesson started (or opened by a link): its own view, nothing selected; the run it
        replaces lets go of its engine now."""
        self.close()
        self.run, self.inspected, self.fits = run, None, FitMemo()
        self.view_choice = run.lesson.meta.get("view", "none")

    def replay(self, run: LessonRun) -> None:
        """The same lesson played again with other inputs: the page's choices stay."""
        self.run = run

    def close(self) -> None:
        if self.run is not None:
            self.run.close()


def lesson_pool(ls: LessonSession, presenter_on: bool, box: tuple[int, int] | None) -> Any:
    """The lesson's picture on screen, fitted to `box`. While the page asks which block, every
    block can be clicked: a run of free blocks folds into rows of their id cells, not one
    labelled row (viz/pool_layout.py); where even so the box shows no slots, the free runs fold
    as usual and the learner types the block's id (a cell per block would hide the slots the
    question is about)."""
    run = ls.run
    step = run.current
    if lesson_ask.asks_block(run):
        fig = page_picture(run, step, presenter_on, box, every_block=True)
        if (fig.layout.meta or {}).get("fit", {}).get("slots", True):
            return fig
    return page_picture(run, step, presenter_on, box)


def page_picture(run: LessonRun, step: Any, large: bool, box: tuple[int, int] | None,
                 every_block: bool = False) -> Any:
    """The picture of a lesson's page `step` (None: the lesson's opening), in `box`: on the
    learner's page and on a room's projector when a teacher plays the lesson there."""
    if step is None:
        return pool_figure(run.intro_view()[0], (), run.decode, large=large, box=box,
                           every_block=every_block)
    return pool_figure(step.snapshot, step.events, run.decode, large=large, box=box,
                       seq_labels={i: f"{n} (seq {i})" for i, n in step.seq_names.items()},
                       bands=step.bands, every_block=every_block)


def lesson_fit(ls: LessonSession, presenter_on: bool, box: tuple[int, int] | None
               ) -> tuple[Any, tuple[int, int] | None]:
    """(the lesson's picture, the box of the view under it; None: no view): the two share the
    page's box (ui/picture_split.py)."""
    run = ls.run
    key = (id(run), id(run.current), run.index, bool(presenter_on))
    return fit_split(ls.fits, key, box, lesson_slide_choice(ls, box),
                     lambda b: lesson_pool(ls, presenter_on, b),
                     lambda width: _view_height(ls, presenter_on, width))


def _view_height(ls: LessonSession, presenter_on: bool, width: int) -> int | None:
    """The height the view under the picture takes at its natural size (the picture gets the
    rest of the slide)."""
    fig = lesson_view(ls, presenter_on, (width, 0))
    return int(fig.layout.height) if fig is not None and fig.layout.height else None


def lesson_values(ls: LessonSession, presenter_on: bool, box: tuple[int, int] | None) -> tuple:
    """The main picture and the panels beside it for the lesson's page on screen: (picture,
    events, sequences, metrics, status line)."""
    run = ls.run
    where = "lesson engine · " + model_status(run.config)
    step = run.current
    picture = lesson_fit(ls, presenter_on, box)[0]
    if step is None:
        snap, info, max_len = run.intro_view()
        return (picture, event_log_markdown([], empty="The lesson's engine is ready: press Next."),
                sequences_html(snap, token_text(run)), metrics_html(snap, info, max_len),
                f"{where} · lesson page 0")
    snap = step.snapshot
    return (picture, event_log_markdown(list(step.events), empty="This step ran no operation."),
            sequences_html(snap, token_text(run)), metrics_html(snap, step.info, step.max_model_len),
            f"{where} · lesson page {step.index + 1} of {step.total}")


def _head(run: LessonRun) -> str:
    return f"**{run.lesson.title}**: page "


def progress_line(ls: LessonSession) -> str:
    """The line that says which lesson and page are on screen ("" with no lesson)."""
    run = ls.run
    if run is None:
        return ""
    step = run.current
    if step is None:
        return f"{_head(run)}0 of {run.total}"
    done = f" · the end: {run.score().sentence() or 'well done'}" if step.is_last else ""
    return f"{_head(run)}{step.index + 1} of {step.total}{done}"


def sent_from(progress: str | None, run: LessonRun) -> int | None:
    """The step of `run` whose page sent an event, from the progress line the page showed then
    (as the browser sends it back: Gradio's Markdown trims its indentation); None where it was
    another lesson's page, or no page."""
    head, text = _head(run), inspect.cleandoc(progress or "")
    found = re.match(r"(\d+) of ", text[len(head):]) if text.startswith(head) else None
    return int(found[1]) - 1 if found and 0 < int(found[1]) <= run.total else None


def lesson_text(ls: LessonSession) -> tuple[str, str, str]:
    """The Lessons tab's own text for the page on screen: (progress, narration, question)."""
    run = ls.run
    if run is None:
        return "", "", ""
    step = run.current
    text = keyed_markdown(run.intro_markdown()) if step is None else \
        page_markdown(step, lesson_ask.verdict_line(run, step.index))
    return progress_line(ls), text, lesson_ask.question_text(run)
