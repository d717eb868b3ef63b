"""The Lessons tab: pick a lesson, read one idea per step, press Next; the engine runs the step
and the MAIN picture, the events panel, the sequences and the numbers show the lesson's engine
(one picture serves the playground and the lessons). Presenter mode (large type) is the page's
checkbox; the right-arrow key presses Next."""

from __future__ import annotations

from typing import Any

import gradio as gr

from lessons import LessonRun, load_all
from lessons.loader import LessonError
from lessons.page_text import keyed_markdown, page_markdown
from ui import lesson_ask
from ui.page import Page
from ui.picture_split import FitMemo, fit_split
from ui.refusal import refused
from ui.render import model_status, token_text
from ui.run_views import lesson_slide_choice, lesson_view
from viz import event_log_markdown, metrics_html, pool_figure, sequences_html


class LessonSession:
    """A lesson run per browser session; never deep-copied (it holds an engine)."""

    def __init__(self) -> None:
        self.run: LessonRun | None = None
        self.box: tuple[int, int] | None = None  # the page's room for the picture
        self.inspected: int | None = None  # the block the inspector shows
        self.fits = FitMemo()  # how the picture and the view under it shared the box, per page

    def __deepcopy__(self, memo: dict) -> LessonSession:
        return LessonSession()


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
        return pool_figure(run.intro_view()[0], (), run.engine.decode, large=large, box=box,
                           every_block=every_block)
    return pool_figure(step.snapshot, step.events, run.engine.decode, large=large, box=box,
                       seq_labels={i: f"{n} (seq {i})" for i, n in step.seq_names.items()},
                       bands=step.bands, every_block=every_block)


def lesson_fit(ls: LessonSession, presenter_on: bool) -> tuple[Any, tuple[int, int] | None]:
    """(the lesson's picture, the box of the view under it; None: no view): the two share the
    page's box (ui/picture_split.py)."""
    run = ls.run
    key = (id(run), id(run.current), run.index, bool(presenter_on))
    return fit_split(ls.fits, key, ls.box, lesson_slide_choice(ls),
                     lambda box: lesson_pool(ls, presenter_on, box),
                     lambda width: _view_height(ls, presenter_on, width))


def _view_height(ls: LessonSession, presenter_on: bool, width: int) -> int | None:
    """The height the view under the picture takes at its natural size (the picture gets the
    rest of the slide)."""
    fig = lesson_view(ls, presenter_on, (width, 0))
    return int(fig.layout.height) if fig is not None and fig.layout.height else None


def lesson_figure(ls: LessonSession, presenter_on: bool) -> Any:
    """The lesson's picture on screen, fitted to the page's box (None before Start)."""
    return None if ls.run is None else lesson_fit(ls, presenter_on)[0]


def lesson_list_markdown(lessons) -> str:
    """One line per lesson. The titles carry their own numbers ("1. The KV cache"), so this is
    not a numbered Markdown list (that read "1. 1. The KV cache")."""
    return "\n\n".join(f"**{lesson.title}**: {lesson.summary}" for lesson in lessons)


def lessons_tab(page: Page, presenter: gr.Checkbox) -> tuple:
    """Build the tab's controls. Returns a function that wires them (once the page's picture and
    panels exist), (fn, inputs, outputs) for the page's load event, which opens the lesson step
    a link names (?lesson=<file name without .md>&step=<1-based step>), and (view fn, inputs,
    outputs) to redraw the lesson when the tab is selected again."""
    try:
        lessons = load_all()
        error = ""
    except LessonError as err:
        lessons, error = [], f"**A lesson failed to load:** {err}"
    by_title = {lesson.title: lesson for lesson in lessons}
    state = page.lesson = gr.State(LessonSession())
    with gr.Row(elem_id="lesson-choose"):
        choice = gr.Dropdown(list(by_title), label="lesson", value=next(iter(by_title), None),
                             min_width=160, scale=3)
        start = gr.Button("Start", variant="primary", elem_id="lesson-start", min_width=70, scale=1)
    with gr.Accordion("All lessons", open=False, elem_id="lesson-all"):
        gr.Markdown(error or lesson_list_markdown(lessons), elem_id="lesson-list")
    progress = gr.Markdown(elem_id="lesson-progress")
    question = gr.Markdown(elem_id="lesson-question")
    ask_widgets = lesson_ask.ask_part()  # the learner's prediction (ui/lesson_ask.py)
    with gr.Row(elem_id="lesson-nav"):
        back = gr.Button("◀ Back", elem_id="lesson-back", min_width=70)
        nxt = gr.Button("Next ▶", variant="primary", elem_id="lesson-next", min_width=70)
        restart = gr.Button("Restart", min_width=70)
    narration = gr.Markdown(elem_id="lesson-narration")
    lesson_ask.inputs_part(ask_widgets)  # the inputs this page lets the learner change

    def view(ls: LessonSession, presenter_on: bool):
        run = ls.run
        cls = ["presenter"] if presenter_on else []
        keep = (gr.update(), gr.update(), gr.update(), gr.update(), gr.update())
        if run is None:
            return (ls, "", gr.update(value="", elem_classes=cls), "", *keep)
        config = run.engine.config
        where = "lesson engine · " + model_status(config)
        step = run.current
        ask = lesson_ask.question_text(run)
        eng = run.engine
        if step is None:
            snap, info, max_len = run.intro_view()
            return (ls, f"**{run.lesson.title}**: page 0 of {run.total}",
                    gr.update(value=keyed_markdown(run.intro_markdown()), elem_classes=cls), ask,
                    lesson_figure(ls, presenter_on),
                    event_log_markdown([], empty="The lesson's engine is ready: press Next."),
                    sequences_html(snap, token_text(eng)),
                    metrics_html(snap, info, max_len), f"{where} · lesson page 0")
        text = page_markdown(step, lesson_ask.verdict_line(run, step.index))
        done = f" · the end: {run.score().sentence() or 'well done'}" if step.is_last else ""
        snap = step.snapshot
        return (ls, f"**{run.lesson.title}**: page {step.index + 1} of {step.total}{done}",
                gr.update(value=text, elem_classes=cls), ask,
                lesson_figure(ls, presenter_on),
                event_log_markdown(list(step.events), empty="This step ran no operation."),
                sequences_html(snap, token_text(eng)),
                metrics_html(snap, step.info, step.max_model_len),
                f"{where} · lesson page {step.index + 1} of {step.total}")

    def guarded(fn):
        def wrapped(ls, presenter_on, *args):
            try:
                fn(ls, *args)
            except (LessonError, ValueError) as err:
                raise refused(fn.__name__, str(err)) from err
            return view(ls, presenter_on)
        return wrapped

    def do_start(ls, title):
        if title not in by_title:
            raise ValueError("choose a lesson first")
        ls.run = LessonRun(by_title[title], device=page.device)

    def do_next(ls, answer=None, pick=None):
        if ls.run is None:
            raise ValueError("press Start first")
        if not ls.run.done:
            ls.run.next(lesson_ask.prediction(ls.run, answer, pick))

    def input_changed(k: int):
        def do_input(ls, value):
            if ls.run is not None:
                ls.run = lesson_ask.change_input(ls.run, k, value)
        return do_input

    def do_back(ls):
        if ls.run is not None:
            ls.run.back()

    def do_restart(ls):
        if ls.run is not None:
            ls.run.restart()

    by_name = {lesson.name: lesson for lesson in lessons}

    def open_link(ls, presenter_on, request: gr.Request):
        query = dict(request.query_params) if request is not None else {}
        name, step = query.get("lesson"), query.get("step", "")
        if not name:
            return (*view(ls, presenter_on), gr.update())
        lesson = by_name.get(name)
        if lesson is None:
            gr.Warning(f"the link names no lesson {name!r}; lessons: {', '.join(by_name)}")
            return (*view(ls, presenter_on), gr.update())
        ls.run = LessonRun(lesson, device=page.device)
        if step.isdigit() and int(step) > 0:
            ls.run.goto(min(int(step), ls.run.total) - 1)
        return (*view(ls, presenter_on), gr.update(value=lesson.title))  # the list names it too

    outs: list = [state, progress, narration, question]

    def wire() -> None:
        outs.extend([page.plot, page.events, page.seqs, page.metrics, page.status])  # built by now
        start.click(guarded(do_start), [state, presenter, choice], outs)
        # a refused prediction marks the status line only, never the picture (ui/page.py)
        nxt.click(guarded(do_next), [state, presenter, ask_widgets.answer, ask_widgets.pick], outs,
                  **page.quiet)
        # a new page (or a new run) sets the prediction widgets and inputs for it
        def asked(ls):
            return lesson_ask.ask_values(ls.run)
        progress.change(asked, [state], ask_widgets.outs, show_progress="hidden")
        for k, drop in enumerate(ask_widgets.inputs):
            drop.input(guarded(input_changed(k)), [state, presenter, drop], outs, **page.quiet).then(
                asked, [state], ask_widgets.outs, show_progress="hidden")
        back.click(guarded(do_back), [state, presenter], outs)
        restart.click(guarded(do_restart), [state, presenter], outs)
        # the picture's large type is redrawn by the page (ui/app.py), which knows what is in front
        presenter.change(lambda p: gr.update(elem_classes=["presenter"] if p else []), [presenter],
                         [narration])
    link_outs: list = []  # filled by wire_all(), which the page calls before it wires the link

    def wire_all() -> None:
        wire()
        link_outs.extend([*outs, choice])
    return wire_all, (open_link, [state, presenter], link_outs), (view, [state, presenter], outs)
