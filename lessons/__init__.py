"""Lessons: Markdown walks through PagedAttention whose every number comes from the live engine.

    from lessons import load_all, LessonRun
    lesson = load_all()[0]
    run = LessonRun(lesson)
    view = run.next()        # StepView: title, narration_markdown, answer, events, snapshot, ...

See lessons/README.md for the format and how to write a lesson.
"""

from lessons.loader import Lesson, LessonError, Param, Step
from lessons.runner import LessonCheckFailed, LessonRun, QuestionView, StepView, load, load_all
from lessons.safe_eval import Evaluator, UnsafeExpression

__all__ = ["Evaluator", "Lesson", "LessonCheckFailed", "LessonError", "LessonRun", "Param", "QuestionView",
           "Step", "StepView", "UnsafeExpression", "load", "load_all"]
