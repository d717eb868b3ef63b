"""The Lessons tab: pick a lesson, read one idea per step, press Next; the engine runs the step
and the picture and numbers update. Presenter mode for projectors: larger type, picture first;
the right-arrow key presses Next."""

from __future__ import annotations

import gradio as gr

from lessons import LessonRun, load_all
from lessons.loader import LessonError
from viz import event_log_markdown, pool_figure


class LessonSession:
    """A lesson run per browser session; never deep-copied (it holds an engine)."""

    def __init__(self) -> None:
        self.run: LessonRun | None = None

    def __deepcopy__(self, memo: dict) -> LessonSession:
        return LessonSession()


def lessons_tab(device: str = "auto") -> tuple:
    """Build the tab. Returns (fn, inputs, outputs) for the page's load event, which opens the
    lesson step a link names: ?lesson=<file name without .md>&step=<1-based step>."""
    try:
        lessons = load_all()
        error = ""
    except LessonError as err:
        lessons, error = [], f"**A lesson failed to load:** {err}"
    by_title = {lesson.title: lesson for lesson in lessons}
    with gr.Tab("Lessons", id="lessons"):
        state = gr.State(LessonSession())
        with gr.Row():
            choice = gr.Dropdown(list(by_title), label="lesson", value=next(iter(by_title), None))
            start = gr.Button("Start", variant="primary", elem_id="lesson-start")
            presenter = gr.Checkbox(label="presenter mode (large type; → key = Next)")
        gr.Markdown(error or "\n".join(f"- **{t}**: {lesson.summary}"
                                                 for t, lesson in by_title.items()))
        with gr.Row():
            with gr.Column(scale=2):
                progress = gr.Markdown()
                narration = gr.Markdown(elem_id="lesson-narration")
                question = gr.Markdown(elem_id="lesson-question")
                with gr.Row():
                    back = gr.Button("◀ Back", elem_id="lesson-back")
                    nxt = gr.Button("Next ▶", variant="primary", elem_id="lesson-next")
                    restart = gr.Button("Restart")
            with gr.Column(scale=3):
                plot = gr.Plot(elem_id="lesson-plot")
                log = gr.Markdown()

        def view(ls: LessonSession, presenter_on: bool):
            run = ls.run
            cls = ["presenter"] if presenter_on else []
            if run is None:
                return (ls, "", gr.update(value="", elem_classes=cls), "", None, "")
            step = run.current
            q = run.question_for_next()
            ask = f"**Before you press Next, predict:** {q.text}" if q else ""
            if step is None:
                return (ls, f"**{run.lesson.title}**: step 0 of {run.total}",
                        gr.update(value=run.intro_markdown(), elem_classes=cls), ask, None, "")
            text = f"### {step.title}\n\n{step.narration_markdown}"
            if step.question:
                text += (f"\n\n**Question:** {step.question}\n\n**The engine's answer:** "
                         f"{step.answer_text}" + (f"\n\n{step.explanation}" if step.explanation else ""))
            done = " · the end: well done" if step.is_last else ""
            fig = pool_figure(step.snapshot, step.events, run.engine.decode)
            return (ls, f"**{run.lesson.title}**: step {step.index + 1} of {step.total}{done}",
                    gr.update(value=text, elem_classes=cls), ask, fig,
                    event_log_markdown(list(step.events)))

        def guarded(fn):
            def wrapped(ls, presenter_on, *args):
                try:
                    fn(ls, *args)
                except (LessonError, ValueError) as err:
                    raise gr.Error(str(err)) from err
                return view(ls, presenter_on)
            return wrapped

        def do_start(ls, title):
            if title not in by_title:
                raise ValueError("choose a lesson first")
            ls.run = LessonRun(by_title[title], device=device)

        def do_next(ls):
            if ls.run is None:
                raise ValueError("press Start first")
            if not ls.run.done:
                ls.run.next()

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
                return view(ls, presenter_on)
            lesson = by_name.get(name)
            if lesson is None:
                gr.Warning(f"the link names no lesson {name!r}; lessons: {', '.join(by_name)}")
                return view(ls, presenter_on)
            ls.run = LessonRun(lesson, device=device)
            if step.isdigit() and int(step) > 0:
                ls.run.goto(min(int(step), ls.run.total) - 1)
            return view(ls, presenter_on)

        outs = [state, progress, narration, question, plot, log]
        start.click(guarded(do_start), [state, presenter, choice], outs)
        nxt.click(guarded(do_next), [state, presenter], outs)
        back.click(guarded(do_back), [state, presenter], outs)
        restart.click(guarded(do_restart), [state, presenter], outs)
        presenter.change(lambda ls, p: view(ls, p), [state, presenter], outs)
        return open_link, [state, presenter], outs
