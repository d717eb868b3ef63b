"""A lesson's questions as a learner answers them (issue 35): the three kinds of answer (a number,
one of a few choices, a block of the pool), the learner's prediction read before the step runs,
the engine's answer checked against its kind after it, the verdict, and the lesson's score.

Every function here is pure: the runner (lessons/runner.py) calls them with what the engine
computed, the page (ui/lesson_player.py) and a classroom's poll (classroom/poll.py) with what
the learner typed. A prediction that cannot be read raises `PredictionError`, whose message says
what to type; nothing is recorded then, so the learner loses nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the kinds of question a lesson may ask (`kind:` in a ```question block; lessons/README.md)
KINDS = ("number", "choice", "block")
MAX_CHOICES = 6  # a phone shows them as one column of buttons
NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
THOUSANDS = re.compile(r"(?<=\d)[,_ ](?=\d{3}(\D|$))")  # "1,024" and "1 024" are 1024
# a number, maybe after "block" and before a word or two of unit ("3 blocks", "25 %")
TYPED = re.compile(r"(?i)(?:block\s*)?([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?)"
                   r"\s*(?:[a-z%]+(?: [a-z]+)?)?\.?")


class PredictionError(ValueError):
    """A learner's answer that cannot be read as the question's kind (the message says why)."""


@dataclass(frozen=True)
class Verdict:
    """One prediction, checked: what the learner said, what the engine did, and whether they
    matched (None: the learner skipped the question)."""

    predicted: Any
    answer: Any
    right: bool | None
    said: str  # the learner's answer as the page writes it ("3 blocks", "block 5", "yes")
    inputs: tuple[tuple[str, Any], ...] = ()  # the lesson's inputs it was made under

    def sentence(self, inputs: tuple[tuple[str, Any], ...] = ()) -> str:
        """The verdict in one line of Markdown; `inputs`: the lesson's inputs now (a verdict
        made under other inputs says which)."""
        if self.right is None:
            return "_You did not predict this one._"
        under = "" if inputs == self.inputs else (
            " (with " + ", ".join(f"{label} {value}" for label, value in self.inputs) + ")")
        if self.right:
            return f"**✓ You predicted {self.said}{under}: right.**"
        return f"**✗ You predicted {self.said}{under}: not what the engine did.**"


@dataclass(frozen=True)
class Score:
    right: int
    answered: int
    questions: int  # questions in the lesson

    def sentence(self) -> str:
        if not self.questions:
            return ""
        if not self.answered:  # "none of the 1 question" read as a slip
            return ("you did not predict its question" if self.questions == 1 else
                    f"you predicted none of its {self.questions} questions")
        return (f"you predicted {self.right} of {self.answered} right"
                + (f" ({self.questions - self.answered} not answered)"
                   if self.answered < self.questions else ""))


def score(verdicts: Sequence[Verdict], questions: int) -> Score:
    return Score(sum(1 for v in verdicts if v.right), sum(1 for v in verdicts if v.right is not None),
                 questions)


# ---- the learner's side -----------------------------------------------------------------------


def read_prediction(kind: str, raw: Any, choices: Sequence[str] = (), num_blocks: int = 0) -> Any:
    """The learner's answer as a value of the question's kind: a number (int where whole), the
    choice as written in the lesson, or a block id of the pool. Raises PredictionError."""
    if kind == "choice":
        text = raw.strip() if isinstance(raw, str) else raw
        for c in choices:
            if isinstance(text, str) and text.casefold() == c.casefold():
                return c
        raise PredictionError(f"choose one of: {' | '.join(choices)}")
    value = _number(raw)
    if kind == "block":
        if value != int(value) or not 0 <= value < num_blocks:
            raise PredictionError(f"a block is a whole number from 0 to {num_blocks - 1}: click one "
                                  "in the picture or type its id")
        return int(value)
    return value


def _number(raw: Any) -> int | float:
    """A number as a learner types it: "3", "1,024", "2.5", "3 blocks", "block 7", "25%"."""
    if isinstance(raw, bool) or raw is None:
        raise PredictionError("type a number, e.g. 3")
    if isinstance(raw, int | float):
        value = raw
    else:
        text = THOUSANDS.sub("", str(raw).strip())
        m = TYPED.fullmatch(text)
        if not m:
            raise PredictionError(f"{str(raw).strip()[:20]!r} is not a number: type digits, e.g. 3 "
                                  "or 1,024")
        value = float(m.group(1))
    if not math.isfinite(value):
        raise PredictionError("type a finite number, e.g. 3")
    return int(value) if float(value).is_integer() and abs(value) < 2 ** 53 else float(value)


# ---- the engine's side ------------------------------------------------------------------------


def check_engine_answer(kind: str, value: Any, choices: Sequence[str], num_blocks: int) -> str | None:
    """Why the engine's answer does not fit the question's kind (a lesson bug), or None."""
    if kind == "choice":
        return None if value in choices else f"the answer {value!r} is not one of the choices {list(choices)}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"a {kind} question's answer must be a number, got {value!r}"
    if kind == "block" and (value != int(value) or not 0 <= value < num_blocks):
        return f"a block question's answer must be a block id from 0 to {num_blocks - 1}, got {value!r}"
    return None


def say(kind: str, value: Any, unit: str = "") -> str:
    """A value of the question's kind as the page writes it: "block 5", "3 blocks" (`unit:
    block`; `unit: copy / copies` for an irregular plural), "1,024", or the choice itself."""
    if kind == "block":
        return f"block {int(value)}"
    if kind != "number":
        return str(value)
    shown = f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"
    if not unit or unit == "%":
        return shown + unit
    one, many = unit_words(unit)
    return f"{shown} {one if value == 1 else many}"


def unit_words(unit: str) -> tuple[str, str]:
    """A question's `unit:` as (one, many): ("block", "blocks"); "copy / copies" for an
    irregular plural."""
    one, _, many = (part.strip() for part in unit.partition("/"))
    return one, many or one + "s"


def matches(kind: str, predicted: Any, answer: Any, within: tuple[float, bool] = (0.0, False)) -> bool:
    """Whether a prediction matches the engine's answer: equal, or for a number within the
    question's tolerance (absolute, or relative to the answer)."""
    if kind != "number":
        return predicted == answer
    amount, relative = within
    slack = abs(answer) * amount / 100 if relative else amount
    return abs(predicted - answer) <= slack + 1e-9


def parse_within(text: str) -> tuple[float, bool]:
    """`within: 2` (absolute) or `within: 10%` (of the engine's answer) -> (amount, relative)."""
    relative = text.endswith("%")
    number = text.removesuffix("%").strip()
    if not NUMBER.fullmatch(number) or float(number) < 0:
        raise ValueError("'within:' takes a number or a percentage, e.g. 'within: 2' or 'within: 10%'")
    return float(number), relative
