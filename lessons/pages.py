"""What a played lesson shows: a question before its step runs (`QuestionView`), a step after it
ran (`StepView`, recorded: Back and Next show it again without engine work), and what the runner
notes before each step to run it again (`Mark`: where the run's history stood, and what the
lesson had bound). lessons/runner.py makes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import Event
from engine.describe.snapshot import Snapshot
from lessons.questions import Verdict


@dataclass(frozen=True)
class QuestionView:
    """A question as the learner sees it before its step runs (lessons/questions.py)."""

    text: str  # Markdown, shown before the step runs
    step_index: int
    kind: str = "number"  # number, choice or block
    choices: tuple[str, ...] = ()
    unit: str = ""
    num_blocks: int = 0  # a block question's answers: 0 .. num_blocks - 1
    verdict: Verdict | None = None  # the step ran already (after Back): its verdict stays


@dataclass(frozen=True)
class StepView:
    """Everything the UI shows for one executed step."""

    index: int  # 0-based
    total: int
    title: str
    narration_markdown: str
    question: str | None  # the question that was asked before this step
    answer: Any  # computed by the engine after the step ran (None when there is no question)
    answer_text: str | None
    explanation: str | None
    events: tuple[Event, ...]
    snapshot: Snapshot
    checks: tuple[str, ...] = ()  # the checks that held, as written
    info: Mapping[str, Any] = field(default_factory=dict)  # the engine's description then
    max_model_len: int = 0
    seq_names: Mapping[int, str] = field(default_factory=dict)  # seq id -> the lesson's name
    # where the picture's moment is in the lesson's run (history/run_history.py): the engine
    # there is the one the inspector reads (LessonRun.engine_for)
    pos: int = 0
    bands: tuple = ()  # rows under the pool the page asks for (`chain`, `reservation`)
    choices: tuple[str, ...] = ()  # a choice question's choices, as asked

    @property
    def is_last(self) -> bool:
        return self.index == self.total - 1


@dataclass
class Mark:
    """The state before a step: enough to run it again."""

    pos: int  # the run's history position the step starts from
    names: dict[str, Any]
    outputs: dict[int, Any]
    seq_names: dict[int, str] = field(default_factory=dict)
