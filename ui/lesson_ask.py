"""What a lesson page asks of the learner (issue 35): the prediction before Next (a number typed,
one of a few choices picked, or a block clicked in the picture), the verdict after it, the score
at the end, and the inputs a page lets the learner change (a dropdown per ```input param: the
lesson plays again to this page with the new value and the page shows the engine's new answer).

The lesson player (ui/lesson_player.py) builds these widgets under the page's question and hands
Next's values to `prediction`; `ask_values` sets the widgets for the page on screen. A block
question marks the answer box `pl-pick-block`: ui/motion.js then writes a click on a pool block
into it instead of opening the inspector. The checking itself is lessons/questions.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from lessons import LessonRun
from lessons.lesson import Param

#: what the answer box says for each kind of question
LABELS = {"number": "your prediction", "block": "click a block (or type its id)"}
MAX_INPUTS = 2  # lessons/loader.py allows two inputs a page


@dataclass
class Ask:
    """The widgets: the answer box (number, block), the choices, the page's input dropdowns."""

    answer: Any
    pick: Any
    inputs: list

    @property
    def outs(self) -> list:
        return [self.answer, self.pick, *self.inputs]


def ask_part() -> Ask:
    """Build the answer widgets (inside the lessons tab, under the question); `inputs_part`
    adds the page's inputs (under its text)."""
    with gr.Column(elem_id="lesson-ask"):
        answer = gr.Textbox(label=LABELS["number"], elem_id="lesson-answer", max_lines=1,
                            visible=False, max_length=40)
        pick = gr.Radio([], label="your prediction", show_label=False, elem_id="lesson-pick",
                        visible=False)
    return Ask(answer, pick, [])


def inputs_part(ask: Ask) -> None:
    """The page's input dropdowns (hidden on a page that offers none). Interactive though no
    event reads their value: a pick's value comes with the pick (ui/lesson_player.py)."""
    with gr.Row(elem_id="lesson-inputs"):
        ask.inputs = [gr.Dropdown([], label="input", elem_id=f"lesson-input-{k}", visible=False,
                                  interactive=True, min_width=120) for k in range(MAX_INPUTS)]


def prediction(run: LessonRun, answer: Any, pick: Any) -> Any:
    """Next's prediction from the widgets: the pick for a choice question, else the typed or
    clicked answer (None: skipped)."""
    q = run.question_for_next()
    if q is None or q.verdict is not None:
        return None
    return pick if q.kind == "choice" else answer


def asks_block(run: LessonRun) -> bool:
    """Whether the page on screen waits for a block to be clicked."""
    q = run.question_for_next()
    return q is not None and q.kind == "block" and q.verdict is None


def page_inputs(run: LessonRun, index: int | None = None) -> list[Param]:
    """The params the page at step `index` (default: the page on screen) lets the learner
    change."""
    if index is None:
        step = run.current
        if step is None:
            return []
        index = step.index
    names = run.lesson.steps[index].inputs
    return [p for p in run.lesson.params if p.name in names]


def ask_values(run: LessonRun | None) -> tuple:
    """The widgets' values for the page on screen: a question not yet answered gets an empty
    answer box or choice, a block question the click marker; the page's inputs their choices."""
    hidden = gr.update(visible=False)
    if run is None:
        return (gr.update(visible=False, value=""), gr.update(visible=False, value=None),
                *(hidden for _ in range(MAX_INPUTS)))
    q = run.question_for_next()
    open_q = q is not None and q.verdict is None  # a step run before keeps its verdict
    kind = q.kind if open_q else ""
    answer = gr.update(visible=kind in ("number", "block"), value="",
                       label=LABELS.get(kind, LABELS["number"]),
                       elem_classes=["pl-pick-block"] if kind == "block" else [])
    pick = gr.update(visible=kind == "choice", value=None,
                     choices=list(q.choices) if kind == "choice" else [])
    shown = page_inputs(run)
    drops = [gr.update(visible=True, label=p.label, choices=[str(c) for c in p.choices],
                       value=str(run.params[p.name])) for p in shown]
    drops += [hidden] * (MAX_INPUTS - len(drops))
    return (answer, pick, *drops)


def change_input(run: LessonRun, k: int, value: Any, index: int | None = None) -> LessonRun:
    """The learner chose `value` in the k-th input of the page at step `index` (default: the
    page on screen): the run played again to the page on screen with it (itself, unchanged,
    where `value` is the one it has)."""
    shown = page_inputs(run, index)
    if not 0 <= k < len(shown):
        raise ValueError("this page has no such input")
    param = shown[k]
    choice = next((c for c in param.choices if str(c) == str(value)), None)
    if choice is None:
        raise ValueError(f"{param.label} is one of: {', '.join(str(c) for c in param.choices)}")
    if choice == run.params[param.name]:
        return run
    return run.change_inputs(**{param.name: choice})


def verdict_line(run: LessonRun, index: int) -> str:
    """The page's verdict on the prediction made before step `index` ("" without a question)."""
    v = run.verdicts.get(index)
    return "" if v is None else v.sentence(run.inputs)


def question_text(run: LessonRun) -> str:
    """What the question area says: the next question, or after the last page the score."""
    q = run.question_for_next()
    if q is not None and q.verdict is None:
        how = " _(click a block in the picture)_" if q.kind == "block" else ""
        return f"**Before you press Next, predict:** {q.text}{how}"
    if q is not None:
        return f"**Next:** {q.text} _(answered when it ran)_"
    if run.done and run.score().questions:
        return f"**The end:** {run.score().sentence()}."
    return ""
