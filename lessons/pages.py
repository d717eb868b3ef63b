"""What a played lesson shows: a question before its step runs (`QuestionView`), a step after it
ran (`StepView`, recorded: Back and Next show it again without engine work), and what the runner
notes before each step to rebuild it by replay (`Mark`). lessons/runner.py makes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine import EngineConfig, Event
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
    # the engine at the point the picture shows: its config and op log (engine_for rebuilds it)
    config: EngineConfig | None = None
    trace: tuple = ()
    bands: tuple = ()  # rows under the pool the page asks for (`chain`, `reservation`)
    choices: tuple[str, ...] = ()  # a choice question's choices, as asked

    @property
    def is_last(self) -> bool:
        return self.index == self.total - 1


@dataclass
class Mark:
    """The state before a step: enough to rebuild it by replay."""

    config: EngineConfig
    trace: list[dict[str, Any]]
    names: dict[str, Any]
    outputs: dict[int, Any]
    seq_names: dict[int, str] = field(default_factory=dict)
