"""What a loaded lesson is: plain, frozen data (steps, narration with parsed placeholders, ops,
checks, questions, params) and the error that names a lesson file's line. lessons/loader.py builds
these from a Markdown file; lessons/runner.py plays them."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine import EngineConfig


class LessonError(ValueError):
    """A lesson file that cannot be loaded or run; the message names the file and the line."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path, self.line, self.problem = str(path), line, problem
        super().__init__(f"{path}:{line}: {problem}")


@dataclass(frozen=True)
class Text:
    """Markdown with placeholders: the parsed expressions, by their source text."""

    source: str
    line: int  # line of the first character in the file
    exprs: tuple[tuple[str, int, ast.Expression], ...] = ()  # (placeholder text, line, tree)


@dataclass(frozen=True)
class Op:
    line: int
    name: str
    target: str | None  # the name the result is bound to
    args: tuple[ast.Expression, ...]
    kwargs: tuple[tuple[str, ast.Expression], ...]
    expect_error: bool = False  # `x = expect_error <op>`: the op must fail; x is its message
    source: str = ""


@dataclass(frozen=True)
class Check:
    line: int
    source: str
    tree: ast.Expression


@dataclass(frozen=True)
class Question:
    """Asked before its step runs, answered by the engine after it (lessons/questions.py): a
    number (`unit:` names what is counted, `within:` the slack a right answer may have), one of
    `choices`, or a block of the pool the learner clicks."""

    text: Text
    answer_line: int
    answer_source: str
    answer: ast.Expression
    explain: Text | None
    kind: str = "number"
    choices: tuple[Text, ...] = ()
    unit: str = ""
    within: tuple[float, bool] = (0.0, False)


@dataclass(frozen=True)
class Step:
    title: str
    line: int
    narration: Text
    ops: tuple[Op, ...] = ()
    checks: tuple[Check, ...] = ()
    question: Question | None = None
    inputs: tuple[str, ...] = ()  # params the page lets the learner change (```input)


@dataclass(frozen=True)
class Param:
    """A choice the learner makes (a dropdown in the UI), read in expressions by its name."""

    name: str
    label: str
    choices: tuple[Any, ...]
    default: Any


@dataclass(frozen=True)
class Lesson:
    path: Path
    title: str
    summary: str
    config: EngineConfig  # device/dtype "auto": the runner may override them
    steps: tuple[Step, ...]
    intro: Text
    dry_reason: str = ""
    params: tuple[Param, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def dry(self) -> bool:
        return self.config.dry


#: the engine settings a lesson may choose (front matter `engine:` and the `engine` verb): every
#: field of EngineConfig but where it runs, which the runner decides (LessonRun's device, dtype)
ENGINE_KEYS: frozenset[str] = frozenset(f.name for f in fields(EngineConfig)) - {"device", "dtype"}
