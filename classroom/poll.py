"""A lesson played in a room, its questions polled (issue 35).

The teacher plays a lesson on the room's projector. While a page's question is open, every
student's page shows it with an answer box; each student has one answer per question, which
they may change until the reveal. The teacher's Next runs the step: the engine computes the
answer (lessons/runner.py, as for one learner), the poll closes, and the class's answers are
counted into a histogram beside the engine's answer.

Names stay with the teacher: what the room publishes (`PollView.public`) counts answers and never
says who gave which; `answers()` lists them by name, and the room hands it out only with its
secret. The lesson runs on an engine of its own (the lesson's config), beside the room's, and
its steps run outside the room's engine lock, so students' requests keep being served.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from classroom.settings import RoomError
from lessons import LessonRun, StepView, load
from lessons.loader import lesson_files
from lessons.questions import PredictionError, matches, read_prediction, say

#: the lessons a room can play, by file name without .md ("03_fork_cow")
LESSON_NAMES = tuple(p.stem for p in lesson_files())


@dataclass(frozen=True)
class Reveal:
    """A question closed by the teacher's Next: the engine's answer and how the class split."""

    step: int
    question: str
    answer: str  # the engine's answer as the page writes it ("2 blocks", "block 5")
    explanation: str
    counts: tuple[tuple[str, int, bool], ...]  # (an answer as written, students, right?)

    @property
    def answered(self) -> int:
        return sum(n for _, n, _ in self.counts)

    @property
    def right(self) -> int:
        return sum(n for _, n, ok in self.counts if ok)

    def public(self) -> dict[str, Any]:
        return {"step": self.step, "question": self.question, "answer": self.answer,
                "explanation": self.explanation, "answered": self.answered, "right": self.right,
                "counts": [{"answer": a, "students": n, "right": ok} for a, n, ok in self.counts]}


@dataclass(frozen=True)
class PollView:
    """One published state of the room's lesson: read by pages and the API without a lock."""

    lesson: str
    title: str
    page: int  # 0: the lesson's opening
    pages: int
    narration: str  # the page's Markdown
    question: dict[str, Any] | None  # the open question (None: none open)
    answered: int  # answers to the open question so far
    reveal: Reveal | None  # the page on screen closed this question
    step: StepView | None = field(default=None, compare=False)  # the page's picture (None: intro)
    run: LessonRun | None = field(default=None, compare=False, repr=False)

    @property
    def done(self) -> bool:
        return self.page >= self.pages

    def public(self) -> dict[str, Any]:
        """The poll as `/room_state` returns it: counts, never names."""
        return {"lesson": self.lesson, "title": self.title, "page": self.page, "pages": self.pages,
                "done": self.done, "question": self.question, "answered": self.answered,
                "reveal": None if self.reveal is None else self.reveal.public()}


class RoomLesson:
    """The lesson a teacher plays in a room, and the class's answers to its questions."""

    def __init__(self, name: Any, device: str = "auto") -> None:
        if name not in LESSON_NAMES:
            raise RoomError(f"no lesson is called {str(name)[:40]!r}; one of: {', '.join(LESSON_NAMES)}")
        self.name = name
        self.run = LessonRun(load(next(p for p in lesson_files() if p.stem == name)), device=device)
        self._answers: dict[int, dict[str, tuple[str, Any]]] = {}  # step -> student -> (label, value)
        self._reveals: dict[int, Reveal] = {}
        self._lock = threading.Lock()  # a step runs for a second: answers wait, never interleave
        self.view = self._publish()

    def answer(self, student_key: str, label: str, raw: Any) -> str:
        """A student's answer to the open question (a new one replaces theirs); returns it as
        the page writes it. Refused, with what to do, when no question is open or it cannot be
        read; nothing is recorded then."""
        with self._lock:
            q = self.run.question_for_next()
            if self._open_step() is None:
                raise RoomError("no question is open now: wait for the teacher's next question")
            try:
                value = read_prediction(q.kind, raw, q.choices, q.num_blocks)
            except PredictionError as err:
                raise RoomError(str(err)) from err
            self._answers.setdefault(q.step_index, {})[student_key] = (label, value)
            self.view = self._publish()
            return say(q.kind, value, q.unit)

    def next(self) -> str:
        """The teacher's Next: close the open question, run the step (the engine answers), count
        the class's answers; returns what happened in words."""
        with self._lock:
            if self.run.done:
                raise RoomError("the lesson is at its end: end it, or play another")
            q = self.run.question_for_next()
            view = self.run.next()
            if q is not None and q.step_index not in self._reveals:
                self._reveals[q.step_index] = self._count(q, view)
            self.view = self._publish()
            reveal = self._reveals.get(view.index)
            if reveal is None:
                return f"page {self.view.page} of {self.view.pages}"
            return (f"the engine answered {reveal.answer}: {reveal.right} of "
                    f"{reveal.answered} students predicted it")

    def answers(self) -> list[dict[str, Any]]:
        """Who answered what (for the teacher only: the room asks for its secret first), a row per
        student: `answer` to the open question, `revealed` to the one the page on screen closed
        and whether it was `right` (None where there is no such answer)."""
        with self._lock:
            rows: dict[str, dict[str, Any]] = {}
            open_q, shown = self._open_step(), self.run.current
            shut = shown.index if shown is not None and shown.index in self._reveals else None
            for step, field_ in ((shut, "revealed"), (open_q, "answer")):
                if step is None:
                    continue
                q = self.run.lesson.steps[step].question
                for key, (label, value) in self._answers.get(step, {}).items():
                    row = rows.setdefault(key, {"student": label, "answer": None, "revealed": None,
                                                "right": None})
                    row["student"], row[field_] = label, say(q.kind, value, q.unit)
                    if field_ == "revealed":
                        row["right"] = matches(q.kind, value, self.run.views[step].answer, q.within)
            return sorted(rows.values(), key=lambda a: a["student"].casefold())

    def close(self) -> None:
        self.run.close()

    # ---- inside ------------------------------------------------------------------------------

    def _open_step(self) -> int | None:
        """The step whose question is open now (None: none is)."""
        q = self.run.question_for_next()
        if q is None or q.verdict is not None or q.step_index in self._reveals:
            return None
        return q.step_index

    def _count(self, q: Any, view: StepView) -> Reveal:
        within = self.run.lesson.steps[q.step_index].question.within
        tally: Counter[Any] = Counter(v for _, v in self._answers.get(q.step_index, {}).values())
        order = {c: i for i, c in enumerate(q.choices)}
        values = sorted(tally, key=lambda v: order.get(v, v) if q.kind == "choice" else v)
        counts = tuple((say(q.kind, v, q.unit), tally[v], matches(q.kind, v, view.answer, within))
                       for v in values)
        return Reveal(q.step_index, q.text, view.answer_text or say(q.kind, view.answer, q.unit),
                      view.explanation or "", counts)

    def _publish(self) -> PollView:
        run = self.run
        step = run.current
        q = run.question_for_next()
        open_q = None
        if self._open_step() is not None:
            open_q = {"step": q.step_index, "text": q.text, "kind": q.kind, "choices": list(q.choices),
                      "unit": q.unit, "num_blocks": q.num_blocks}
        narration = run.intro_markdown() if step is None else step.narration_markdown
        return PollView(self.name, run.lesson.title, run.index, run.total, narration, open_q,
                        len(self._answers.get(q.step_index, {})) if open_q else 0,
                        None if step is None else self._reveals.get(step.index), step, run)
