"""A lesson in a room, as the pages show it (issue 35; classroom/poll.py holds the poll itself).

The teacher's page: a lesson to play, Play / Next / End, and beside the projector's picture the
page's key sentence, the open question with how many students answered, then after Next the
engine's answer with the class's answers as a histogram; under the projected area, who answered
what (names stay with the teacher: the page reads them with the room's secret). The picture is
the lesson's while one plays. A student's page: the open question with an answer box (a number
or block id typed, or a choice picked), their answer until the reveal, then the engine's.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

import gradio as gr

from classroom.poll import LESSON_NAMES, PollView
from lessons import load_all
from lessons.page_text import split_key
from lessons.questions import unit_words
from ui.lesson_pages import page_picture
from viz.poll_figure import poll_figure


@dataclass
class TeacherPoll:
    lesson: Any
    buttons: dict[str, Any]  # play, next, end
    text: Any  # where the lesson is, the page's key sentence, the engine's answer
    ask: Any  # the question open now and how many answered
    names: Any  # who answered what (hidden on the projector)

    @property
    def outs(self) -> list[Any]:
        return [self.text, self.ask, self.names]


def teacher_part() -> TeacherPoll:
    """The lesson row and the poll's panels (inside the teacher's page)."""
    with gr.Row(elem_id="room-lesson-row"):
        # a class reads the lessons' titles; the room plays a lesson by its file name
        titles = [(lesson.title, lesson.name) for lesson in load_all() if lesson.name in LESSON_NAMES]
        lesson = gr.Dropdown(titles, value=LESSON_NAMES[0], label="play a lesson in the room",
                             elem_id="room-lesson", scale=3)
        buttons = {a: gr.Button(label, elem_id=f"room-lesson-{a}", size="sm", min_width=70,
                                variant="primary" if a == "next" else "secondary")
                   for a, label in (("play", "Play"), ("next", "Next ▶"), ("end", "End"))}
    text = gr.Markdown(elem_id="room-poll")
    ask = gr.Markdown(elem_id="room-poll-ask")
    names = gr.HTML(elem_id="room-poll-names")
    return TeacherPoll(lesson, buttons, text, ask, names)


def lesson_picture(poll: PollView, box: tuple[int, int] | None, large: bool) -> Any:
    """The lesson's picture on the projector: the page the poll published, or the opening."""
    return page_picture(poll.run, poll.step, large, box)


def poll_markdown(poll: PollView | None) -> tuple[str, str]:
    """The lesson's page beside the picture: (where it is, the key sentence and the engine's
    answer to the question this page closed; the question it opens, with how many answered)."""
    if poll is None:
        return "", ""
    key, _ = split_key(poll.narration)
    head = [f"**{html.escape(poll.title)}** · page {poll.page} of {poll.pages}", f"> {key}" if key else ""]
    if poll.reveal is not None:
        r = poll.reveal
        head.append(f"**The engine: {r.answer}.** {r.explanation}".strip())
    ask = []
    if poll.question is not None:
        q, n = poll.question, poll.answered
        ask = [f"**Predict:** {q['text']}", " · ".join(f"**{c}**" for c in q["choices"]),
               f"**{n}** answered so far"]
    elif poll.done:
        ask = ["_The end of the lesson._"]
    return "\n\n".join(p for p in head if p), "\n\n".join(p for p in ask if p)


def poll_plot(poll: PollView, box: tuple[int, int] | None, large: bool) -> Any:
    """The class's answers beside the engine's, under the lesson's picture once revealed (None:
    nothing revealed on this page)."""
    if poll.reveal is None:
        return None
    r = poll.reveal
    width, height = box if box else (None, 0)
    return poll_figure(r.counts, r.answer, large=large, width=width, height=height or None)


def names_html(answers: list[dict[str, Any]]) -> str:
    """Who answered what (the teacher's eyes only: hidden in the projector view): the question
    the page revealed, with ✓ / ✗, and the one open now."""
    if not answers:
        return ""
    mark = {True: " ✓", False: " ✗", None: ""}

    def cell(a: dict[str, Any], k: str) -> str:
        return html.escape(a[k] or "-") + (mark[a["right"]] if k == "revealed" else "")

    rows = "".join(f"<tr><td>{html.escape(a['student'])}</td><td>{cell(a, 'revealed')}</td>"
                   f"<td>{cell(a, 'answer')}</td></tr>" for a in answers)
    return ("<details id='room-poll-who'><summary>who answered what</summary><table><tr><th>student"
            f"</th><th>revealed</th><th>open question</th></tr>{rows}</table></details>")


@dataclass
class StudentPoll:
    text: Any  # the question, the student's answer, or the engine's
    answer: Any  # a number or a block id, typed
    pick: Any  # one of a choice question's choices
    send: Any


def student_part() -> StudentPoll:
    with gr.Column(elem_id="student-poll-box"):
        text = gr.Markdown(elem_id="student-poll")
        answer = gr.Textbox(label="your prediction", elem_id="student-answer", max_lines=1,
                            max_length=40, visible=False)
        pick = gr.Radio([], label="your prediction", elem_id="student-pick", visible=False)
        send = gr.Button("Answer", elem_id="student-answer-send", visible=False)
    return StudentPoll(text, answer, pick, send)


def student_poll(poll: PollView | None, mine: str, before: str = "", fresh: bool = False
                 ) -> tuple[str, Any, Any, Any]:
    """(the text, the answer box, the choices, the button) for a student, who answered `mine`
    to the open question ("" not yet) and `before` to the one the page revealed. `fresh`: the
    widgets show this question for the first time, so they start empty (they held the answer to
    the question before, which one press of Answer sent again)."""
    hide = gr.update(visible=False)
    if poll is None:
        return "", hide, hide, hide
    parts = [f"**{html.escape(poll.title)}** · page {poll.page} of {poll.pages}"]
    if poll.reveal is not None:
        r = poll.reveal
        parts.append(f"**The engine: {r.answer}.** {r.right} of {r.answered} predicted it.")
        right = any(a == before and ok for a, _, ok in r.counts)
        if before:
            parts.append(f"**{'✓' if right else '✗'} You predicted {html.escape(before)}: "
                         f"{'right' if right else 'not what the engine did'}.**")
    q = poll.question
    if q is None:
        parts.append("_The end of the lesson._" if poll.done else "_Wait for the teacher's next question._")
        return "\n\n".join(parts), hide, hide, hide
    parts.append(f"**Predict:** {_phone_question(q)}")
    if mine:
        parts.append(f"Your answer: **{html.escape(mine)}** (change it until the teacher presses Next)")
    text = "\n\n".join(parts)
    empty = {"value": None} if fresh else {}
    if q["kind"] == "choice":
        return text, hide, gr.update(choices=q["choices"], visible=True, **empty), gr.update(visible=True)
    empty = {"value": ""} if fresh else {}
    return (text, gr.update(visible=True, label=_answer_label(q), **empty), hide,
            gr.update(visible=True))


def _phone_question(q: dict) -> str:
    """The question as a phone asks it: a phone shows no picture, so a block question's "click
    it" becomes "type its id" (the projector shows the blocks)."""
    text = q["text"]
    if q["kind"] != "block":
        return text
    text = re.sub(r"\s*Click it\b[^.?!]*[.?!]?", "", text).rstrip()
    return f"{text} Type its block id (the projector shows the blocks)."


def _answer_label(q: dict) -> str:
    """What the box takes, short enough for a phone: "your prediction: a block id", "… (blocks)"."""
    if q["kind"] == "block":
        return "your prediction: a block id"
    unit = q["unit"]
    if not unit or unit == "%":
        return f"your prediction{' (%)' if unit else ''}"
    return f"your prediction ({unit_words(unit)[1]})"
