"""The Lessons tab: pick a lesson, read one idea per step, press Next; the engine runs the step
and the MAIN picture, the events panel, the sequences and the numbers show the lesson's engine
(one picture serves the playground and the lessons). Presenter mode (large type) is the page's
checkbox; the right-arrow key presses Next."""

from __future__ import annotations

import gradio as gr

from lessons import LessonRun, load_all
from lessons.loader import LessonError
from ui import lesson_ask
from ui.lesson_pages import LessonSession, lesson_text, sent_from
from ui.page import Page, show
from ui.refusal import refused
from ui.session import Session


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

    def view(ls: LessonSession, session: Session) -> tuple:
        """The lesson's page on screen: the tab's text, then the page (ui/front.py draws the
        lesson while it is in front)."""
        progress, text, ask = lesson_text(ls)
        cls = ["presenter"] if session.presenter else []
        return (ls, progress, gr.update(value=text, elem_classes=cls), ask, *show(session))

    def guarded(fn):
        def wrapped(ls, session: Session, *args):
            try:
                fn(ls, *args)
            except (LessonError, ValueError) as err:
                raise refused(fn.__name__, str(err)) from err
            session.front = ls  # whatever the tab shows, the picture shows this lesson
            return view(ls, session)
        return wrapped

    def do_start(ls, title):
        if title not in by_title:
            raise ValueError("choose a lesson first")
        ls.play(LessonRun(by_title[title], device=page.device))

    def do_next(ls, answer=None, pick=None):
        if ls.run is None:
            raise ValueError("choose a lesson in the list and press Start first")
        if ls.run.done:  # said, not refused: nothing is wrong, the lesson is over
            gr.Info(f"This is the last page of {ls.run.lesson.title}: press Restart to play it "
                    "again, or choose another lesson in the list and press Start.", duration=12)
            return
        ls.run.next(lesson_ask.prediction(ls.run, answer, pick))

    def input_changed(k: int):
        def on_lesson_input(ls: LessonSession, session: Session, shown: str,
                            picked: gr.SelectData) -> tuple:
            """The learner picked a value in the k-th input of the page that showed `shown`
            (its progress line): the lesson plays again with it, to the page on screen. A pick
            (`select`), not the dropdown's `input`, which Gradio sends at every blur too: a
            clicker's arrow from the open box blurs it as it presses Next, and that event,
            answered after Next's, was refused by the next page's box (Gradio checks a box's
            choices first). A pick can still race a page turn, so it is read against the page
            it was made on; one that changes nothing draws nothing (its answer, landing after
            Next's, would show the page before again)."""
            index = None if ls.run is None else sent_from(shown, ls.run)
            if index is None:  # another lesson's page, or none
                return tuple(gr.skip() for _ in outs)
            try:
                run = lesson_ask.change_input(ls.run, k, picked.value, index)
            except (LessonError, ValueError) as err:
                raise refused("on_lesson_input", str(err)) from err
            if run is ls.run:
                return tuple(gr.skip() for _ in outs)
            ls.replay(run)
            session.front = ls
            return view(ls, session)
        return on_lesson_input

    def do_back(ls):
        if ls.run is not None:
            ls.run.back()

    def do_restart(ls):
        if ls.run is not None:
            ls.run.restart()

    by_name = {lesson.name: lesson for lesson in lessons}

    def open_link(ls, session: Session, request: gr.Request):
        """?lesson=02_paging&step=3 opens that lesson step in front of the picture; None when the
        page's address names no lesson."""
        query = dict(request.query_params) if request is not None else {}
        name, step = query.get("lesson"), query.get("step", "")
        if not name:
            return None
        lesson = by_name.get(name)
        if lesson is None:
            gr.Warning(f"the link names no lesson {name!r}; lessons: {', '.join(by_name)}")
            return None
        ls.play(LessonRun(lesson, device=page.device))
        if step.isdigit() and int(step) > 0:
            ls.run.goto(min(int(step), ls.run.total) - 1)
        session.front = ls
        return (*view(ls, session), gr.update(value=lesson.title))  # the list names it too

    outs: list = [state, progress, narration, question]

    def wire() -> None:
        outs.extend(page.outs)  # built by now
        start.click(guarded(do_start), [state, page.state, choice], outs)
        # a refused prediction marks the status line only, never the picture (ui/page.py)
        nxt.click(guarded(do_next), [state, page.state, ask_widgets.answer, ask_widgets.pick], outs,
                  **page.quiet)
        # a new page (or a new run) sets the prediction widgets and inputs for it
        def asked(ls):
            return lesson_ask.ask_values(ls.run)
        progress.change(asked, [state], ask_widgets.outs, show_progress="hidden")
        for k, drop in enumerate(ask_widgets.inputs):
            drop.select(input_changed(k), [state, page.state, progress], outs,
                        **page.quiet).then(asked, [state], ask_widgets.outs, show_progress="hidden")
        back.click(guarded(do_back), [state, page.state], outs)
        restart.click(guarded(do_restart), [state, page.state], outs)
        # the picture's large type is redrawn by the page (ui/app.py), which knows what is in front
        presenter.change(lambda p: gr.update(elem_classes=["presenter"] if p else []), [presenter],
                         [narration])
    link_outs: list = []  # filled by wire_all(), which the page calls before it wires the link

    def wire_all() -> None:
        wire()
        link_outs.extend([*outs, choice])
    return wire_all, (open_link, [state, page.state], link_outs), (view, [state, page.state], outs)
