"""Playing a lesson on a live engine: Next runs a step's ops and fills its narration from the engine,
Back and Next over steps already run show their recorded pages (no engine work); Next past the
last one run runs the next step; Restart starts over.

A lesson's run is a run history (history/run_history.py), the same as the Playground's: every
engine operation of every step goes through it, so its op log is the source of truth, a page's
picture is a position in it, and the inspector reads the engine at that position
(`engine_for`), moved there from a checkpoint. A lesson is linear, so a step shown again is the
page recorded when it ran (what a replay would give: the tests check it); running a step again
(`goto(i, rerun=True)`) moves the history's cursor back to where it started and drops the future.

UI contract::

    run = LessonRun(lesson)                 # the engine is built on first use
    q = run.question_for_next()             # ask before Next (None when the step has no question)
    view = run.next()                       # StepView: title, narration_markdown, answer, events ...
    run.back(); run.restart(); run.goto(i)  # the pages of earlier steps, as recorded
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks, ops
from engine.describe.snapshot import Snapshot
from history import RunHistory
from lessons import context
from lessons.context import KNOWN_NAMES, show
from lessons.lesson import ENGINE_KEYS, Lesson, LessonError, Op, Text
from lessons.loader import PLACEHOLDER, lesson_files
from lessons.loader import load as _load
from lessons.pages import Mark, QuestionView, StepView
from lessons.questions import (
    PredictionError,
    Score,
    Verdict,
    check_engine_answer,
    matches,
    read_prediction,
    say,
    score,
)
from lessons.safe_eval import Evaluator, UnsafeExpression
from lessons.verbs import MAX_RUN_STEPS, VERBS, PlayState

__all__ = ["KNOWN_NAMES", "MAX_RUN_STEPS", "LessonCheckFailed", "LessonRun", "QuestionView",
           "StepView", "load", "load_all"]


class LessonCheckFailed(LessonError):
    """A check of a lesson did not hold on the engine (the lesson's claim and the engine disagree)."""


#: verbs whose result is a sequence id: `a = add_sequence ...` names sequence a in the picture
SEQUENCE_VERBS = ("add_sequence", "fork")

def load(path: str | Any) -> Lesson:
    """Load and check one lesson (names are checked against what the runner provides)."""
    return _load(path, known_names=KNOWN_NAMES)


def load_all(directory: str | Any = None) -> list[Lesson]:
    """Every lesson in lessons/ (or `directory`), sorted by file name."""
    return [load(p) for p in lesson_files(directory)]


class LessonRun:
    """One learner's (or one classroom's) pass through a lesson."""

    def __init__(self, lesson: Lesson, device: str = "auto", dtype: str = "auto",
                 params: Mapping[str, Any] | None = None, check_invariants: bool = True) -> None:
        self.lesson = lesson
        self.params = {p.name: p.default for p in lesson.params}
        for k, v in (params or {}).items():
            spec = next((p for p in lesson.params if p.name == k), None)
            if spec is None or v not in spec.choices:
                raise ValueError(f"lesson {lesson.name}: {k}={v!r} is not one of its params' choices")
            self.params[k] = v
        # a param named after an engine setting sets it (lessons/README.md: inputs)
        settings = {k: v for k, v in self.params.items() if k in ENGINE_KEYS}
        self.base_config = replace(lesson.config, device=device, dtype=dtype, **settings)
        self.verdicts: dict[int, Verdict] = {}  # step index -> the learner's checked prediction
        self.check_invariants = check_invariants
        self.history = RunHistory(self.base_config)  # the lesson's run; its engine on first use
        self.state = PlayState()
        self._marks: list[Mark] = []
        self.views: list[StepView] = []
        self._shown: int | None = None  # the view on screen (None: the intro)

    # ---- the UI's API ----------------------------------------------------------------------------

    @property
    def engine(self) -> LLMEngine:
        """The engine at the run's cursor: where the next step acts (moved there if need be)."""
        return self.history.engine

    @property
    def config(self) -> EngineConfig:
        """The engine config of the page on screen (a lesson's `engine` verb may change it)."""
        return self.history.config_at(self.history.pos)

    def decode(self, token_ids: Any) -> str:
        """Token ids as text (the same at every page: no engine moves)."""
        return self.history.decode(token_ids)

    def act(self, op: ops.Op) -> Any:
        """Run one engine operation at the run's cursor (the verbs call this)."""
        return self.history.act(op, frame=False)

    def picture_here(self) -> int:
        """The run's cursor, its frame recorded: a page's picture (the `show` verb)."""
        self.history.frame()
        return self.history.pos

    @property
    def index(self) -> int:
        """How many steps are behind the one on screen (the next to show is steps[index])."""
        return 0 if self._shown is None else self._shown + 1

    @property
    def total(self) -> int:
        return len(self.lesson.steps)

    @property
    def done(self) -> bool:
        return self.index >= self.total

    @property
    def current(self) -> StepView | None:
        return None if self._shown is None else self.views[self._shown]

    def intro_view(self) -> tuple[Snapshot, Mapping[str, Any], int]:
        """(snapshot, engine description, max tokens per sequence) before the first step."""
        frame = self.history.frame(0)
        return frame.snapshot, frame.info, frame.max_model_len

    @property
    def shown_snapshot(self) -> Snapshot:
        """The snapshot of the page on screen (the intro's before the first page)."""
        return self.current.snapshot if self.current is not None else self.intro_view()[0]

    def frame_at(self, view: StepView | None) -> Any:
        """The run's frame (history/frame.py) at a page's picture (None: the intro's)."""
        return self.history.frame(0 if view is None else view.pos)

    def engine_for(self, view: StepView | None) -> LLMEngine:
        """The engine in the state a page's picture shows (None: the intro's), for reading its
        K/V: the run's engine, moved to that position (from a checkpoint near it). Never another
        state's bytes."""
        return self.history.engine_at(0 if view is None else view.pos)

    def intro_markdown(self) -> str:
        return self._render(self.lesson.intro)

    def question_for_next(self) -> QuestionView | None:
        """The question of the next step, rendered now (before it runs), or None; a step that
        ran already carries its verdict (the prediction made then stays)."""
        if self.done:
            return None
        q = self.lesson.steps[self.index].question
        if q is None:
            return None
        ran = self.index < len(self.views)
        text = self.views[self.index].question if ran else self._render(q.text)
        choices = tuple(self._render(c) for c in q.choices) if not ran else self.views[self.index].choices
        return QuestionView(text, self.index, q.kind, choices, q.unit,
                            self.shown_snapshot.num_blocks, self.verdicts.get(self.index))

    @property
    def inputs(self) -> tuple[tuple[str, Any], ...]:
        """The learner's inputs now, as (label, value): what a verdict was made under."""
        return tuple((p.label, self.params[p.name]) for p in self.lesson.params)

    def score(self) -> Score:
        """How many of the lesson's questions the learner predicted right so far."""
        asked = sum(1 for st in self.lesson.steps if st.question is not None)
        return score(list(self.verdicts.values()), asked)

    def next(self, prediction: Any = None) -> StepView:
        """Run (or show again) the next step. `prediction`: the learner's answer to its question,
        read before the step runs (None or "": skipped); one that cannot be read raises
        PredictionError and nothing runs."""
        if self.done:
            raise IndexError(f"lesson {self.lesson.name} has only {self.total} steps")
        blank = prediction is None or (isinstance(prediction, str) and not prediction.strip())
        if self.index < len(self.views):  # run before: show it as it was
            if not blank and self.index not in self.verdicts:
                raise PredictionError("this step ran already, so its answer is known: Restart to "
                                      "predict it again")
            self._show(self.index)
            return self.views[self._shown]
        q = self.question_for_next()
        if q is None and not blank:
            raise PredictionError("this step asks nothing to predict")
        guess = None if blank or q is None else read_prediction(q.kind, prediction, q.choices, q.num_blocks)
        i = len(self._marks)
        self.history.frame(0)  # the intro's picture, recorded before anything runs
        start = self.history.pos
        self._marks.append(Mark(start, dict(self.state.names), dict(self.state.outputs),
                                dict(self.state.seq_names)))
        try:
            view = self._run_step(i)
        except BaseException:  # the page did not happen: its ops go too
            self._marks.pop()
            self.history.goto(start)
            self.history.truncate()
            raise
        self.views.append(view)
        self._shown = len(self.views) - 1
        if q is not None:
            question = self.lesson.steps[i].question
            right = None if guess is None else matches(q.kind, guess, view.answer, question.within)
            said = "" if guess is None else say(q.kind, guess, q.unit)
            # a verdict made under earlier inputs stays (change_inputs replays without one)
            self.verdicts.setdefault(i, Verdict(guess, view.answer, right, said, self.inputs))
        return view

    def back(self) -> StepView | None:
        """Show the step before the current one, as recorded. None: back at the intro."""
        self._show(None if self.index <= 1 else self._shown - 1)
        return self.current

    def restart(self) -> None:
        self.history.goto(0)
        self.history.truncate()
        self.state = PlayState()
        self._marks.clear()
        self.views.clear()
        self.verdicts.clear()
        self._shown = None

    def goto(self, index: int, rerun: bool = False) -> StepView:
        """Show step `index` (0-based): as recorded if it ran, else run the steps up to it.
        rerun=True runs it again: the engine replays the op log up to it first."""
        if not 0 <= index < self.total:
            raise IndexError(f"step {index} is not in 0..{self.total - 1}")
        if index < len(self.views) and not rerun:
            self._show(index)
            return self.views[index]
        if index >= len(self.views):
            self._show(len(self.views) - 1 if self.views else None)
            while self.index <= index:
                view = self.next()
            return view
        mark = self._marks[index]
        self.history.goto(mark.pos)  # the next act drops the future, as in an editor
        self.history.truncate()
        self.state = PlayState(dict(mark.names), dict(mark.outputs), dict(mark.seq_names))
        del self._marks[index:]
        del self.views[index:]
        for i in [i for i in self.verdicts if i >= index]:
            del self.verdicts[i]
        self._shown = index - 1 if index else None
        return self.next()

    def _show(self, shown: int | None) -> None:
        """Put page `shown` (None: the intro) on screen: the run's cursor goes where it ended."""
        self._shown = shown
        if shown is None:
            self.history.goto(self._marks[0].pos if self._marks else 0)
        elif shown + 1 < len(self._marks):
            self.history.goto(self._marks[shown + 1].pos)
        else:
            self.history.goto(len(self.history))

    def change_inputs(self, **params: Any) -> LessonRun:
        """The learner changed an input on this page (```input): a new run of the lesson with
        these params, played to the page on screen, so it shows the engine's new answer. The
        predictions made so far stay (each says the inputs it was made under); this run's
        engine is closed."""
        new = LessonRun(self.lesson, self.base_config.device, self.base_config.dtype,
                        {**self.params, **params}, self.check_invariants)
        new.verdicts = {i: v for i, v in self.verdicts.items() if i < self.index}
        if self.index:
            new.goto(self.index - 1)
        self.close()
        return new

    def close(self) -> None:
        """Free this run's engine (the KV pool, a tensor-parallel lesson's workers) now."""
        self.history.let_go()

    def run_all(self) -> list[StepView]:
        while not self.done:
            self.next()
        return list(self.views)

    # ---- running a step --------------------------------------------------------------------------

    def _run_step(self, i: int) -> StepView:
        step = self.lesson.steps[i]
        asked = None if step.question is None else self._render(step.question.text)
        choices = () if step.question is None else tuple(self._render(c) for c in step.question.choices)
        num_blocks = self.engine.snapshot().num_blocks  # what a block question could name
        st = self.state
        st.events, st.shown, st.bands = [], None, []
        for op in step.ops:
            if op.name != "show":  # `show` looks back at the op before it
                st.op_start = len(st.events)
            self._run_op(op)
        if self.check_invariants:
            try:
                self.engine.check_invariants()
            except Exception as e:  # an engine bug, but the lesson is where a teacher sees it
                raise LessonCheckFailed(self.lesson.path, step.line, f"engine invariant broken: {e}") from e
        evaluator = self._evaluator()
        held = []
        for c in step.checks:
            try:
                ok = evaluator.eval(c.tree)
            except UnsafeExpression as e:
                raise LessonCheckFailed(self.lesson.path, c.line, f"check {c.source!r} failed to evaluate: "
                                                                  f"{e}") from None
            if not ok:
                raise LessonCheckFailed(self.lesson.path, c.line, f"check failed: {c.source}"
                                                                  f"{self._explain(c.tree, evaluator)}")
            held.append(c.source)
        answer = answer_text = explanation = None
        if step.question is not None:
            q = step.question
            answer = self._eval(q.answer, q.answer_line, evaluator)
            wrong = check_engine_answer(q.kind, answer, choices, num_blocks)
            if wrong:
                raise LessonError(self.lesson.path, q.answer_line, wrong)
            answer_text = say(q.kind, answer, q.unit)
            if step.question.explain is not None:
                explanation = self._render(step.question.explain, evaluator)
        pos, events = st.shown or (self.history.pos, tuple(st.events))
        frame = self.history.frame(pos)  # recorded now (the engine is there) or at `show`
        return StepView(i, self.total, step.title, self._render(step.narration, evaluator), asked,
                        answer, answer_text, explanation, events, frame.snapshot, tuple(held),
                        frame.info, frame.max_model_len, dict(st.seq_names), pos,
                        tuple(st.bands), choices)

    def _run_op(self, op: Op) -> None:
        ev = self._evaluator()
        args = [self._eval(a, op.line, ev) for a in op.args]
        kwargs = {k: self._eval(v, op.line, ev) for k, v in op.kwargs}
        try:
            result = self._do(op, args, kwargs)
        except (ValueError, OutOfBlocks, RuntimeError) as e:
            if isinstance(e, LessonError):
                raise
            if op.expect_error:
                if op.target:
                    self.state.names[op.target] = str(e)
                return
            raise LessonError(self.lesson.path, op.line, f"'{op.source}' failed: {e}") from None
        if op.expect_error:
            raise LessonCheckFailed(self.lesson.path, op.line, f"'{op.source}' was expected to fail "
                                                               f"but succeeded")
        if op.target:
            self.state.names[op.target] = result
            if op.name in SEQUENCE_VERBS and isinstance(result, int):
                self.state.seq_names[result] = op.target  # the picture names it as the text does

    def _do(self, op: Op, args: list[Any], kw: dict[str, Any]) -> Any:
        verb = VERBS.get(op.name)
        if verb is None:  # the loader refuses unknown verbs; this is a guard for new ones
            raise LessonError(self.lesson.path, op.line, f"operation {op.name!r} is not implemented")
        return verb.do(self, args, kw)

    def reconfigure(self, settings: dict[str, Any]) -> None:
        """The `engine` verb: a fresh engine with these settings changed (its op log starts
        empty), from the run's cursor on."""
        self.history.reconfigure(replace(self.config, **settings))

    # ---- expressions -----------------------------------------------------------------------------

    def _evaluator(self) -> Evaluator:
        return context.evaluator(self.engine, self.state, self.params, len(self._marks), self.total)

    def _eval(self, tree: ast.Expression, line: int, evaluator: Evaluator | None = None) -> Any:
        try:
            return (evaluator or self._evaluator()).eval(tree)
        except UnsafeExpression as e:
            raise LessonError(self.lesson.path, line, f"{ast.unparse(tree)!r}: {e}") from None

    def _render(self, text: Text, evaluator: Evaluator | None = None) -> str:
        evaluator = evaluator or self._evaluator()
        values = iter([show(self._eval(tree, line, evaluator)) for _, line, tree in text.exprs])
        return PLACEHOLDER.sub(lambda m: next(values), text.source)

    def _explain(self, tree: ast.Expression, evaluator: Evaluator) -> str:
        """For a failed comparison, the values on each side: what the engine actually said."""
        node = tree.body
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            try:
                shown = [f"{ast.unparse(p)} = {show(evaluator.eval(ast.Expression(p)))}" for p in parts]
            except UnsafeExpression:
                return ""
            return " (" + "; ".join(shown) + ")"
        return ""
