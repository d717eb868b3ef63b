"""Reading a lesson file: its steps, narration with `{{ ... }}` placeholders, ops, checks and
questions (the front matter is read by front_matter.py, one op line by op_lines.py). Everything
is parsed and checked at load time, so a typo fails with file and line before a class sees it,
not in the middle of a lesson.

File shape (see lessons/README.md for the full guide)::

    ---
    title: ...
    summary: ...
    engine: {model: default, block_size: 4, num_gpu_blocks: 32}
    ---
    Optional intro Markdown.

    ## Step: A title
    Narration with {{ len(table(a)) }} placeholders.
    ```ops
    a = add_sequence "The quick brown fox"
    ```
    ```check
    len(table(a)) >= 1
    ```
    ```question
    How many blocks will the prompt take?
    answer: len(table(a))
    explain: Each block holds {{ block_size }} tokens.
    ```
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lessons import front_matter as fm
from lessons.lesson import ENGINE_KEYS, Check, Lesson, LessonError, Op, Param, Question, Step, Text
from lessons.op_lines import parse_expr, parse_op, split_args
from lessons.questions import KINDS, MAX_CHOICES, parse_within
from lessons.safe_eval import free_names

# the data model and the op-line parser live beside this module; their names stay importable here
__all__ = ["ENGINE_KEYS", "PLACEHOLDER", "Check", "Lesson", "LessonError", "Op", "Param", "Question",
           "Step", "Text", "check_names", "lesson_files", "load", "split_args"]

PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}")
STEP_HEADING = re.compile(r"^##\s+Step:\s*(.*\S)\s*$")
FENCE = re.compile(r"^```\s*([A-Za-z_]*)\s*$")
# ---- loading --------------------------------------------------------------------------------------


def load(path: str | Path, known_names: set[str] | None = None) -> Lesson:
    """Parse one lesson file. `known_names`: the context names and helpers a runner provides (the
    runner passes its own; names are then checked statically, so a typo fails at load time)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise LessonError(path, 0, f"cannot read the lesson: {e}") from None
    lines = text.splitlines()
    meta, body_start = fm.front_matter(path, lines)
    title = fm.required_str(path, meta, "title")
    summary = fm.required_str(path, meta, "summary")
    params = fm.params(path, meta)
    config, dry_reason = fm.engine_config(path, meta, params)
    fm.engine_params(path, config, params, meta)
    intro, steps = _body(path, lines, body_start, params)
    if not steps:
        raise LessonError(path, body_start + 1, "the lesson has no steps (start one with '## Step: a title')")
    lesson = Lesson(path, title, summary, config, tuple(steps), intro, dry_reason, params, meta)
    if known_names is not None:
        check_names(lesson, known_names)
    return lesson


def _body(path: Path, lines: list[str], start: int,
          params: tuple[Param, ...] = ()) -> tuple[Text, list[Step]]:
    sections: list[tuple[str | None, int, list[tuple[int, str]]]] = [(None, start + 1, [])]
    for i in range(start, len(lines)):
        m = STEP_HEADING.match(lines[i])
        if m:
            sections.append((m.group(1), i + 1, []))
        elif lines[i].startswith("## Step"):
            raise LessonError(path, i + 1, "a step heading reads '## Step: a title'")
        else:
            sections[-1][2].append((i + 1, lines[i]))
    intro = _text(path, [ln for ln in sections[0][2]], sections[0][1])
    return intro, [_step(path, title, line, body, params) for title, line, body in sections[1:] if title]


def _step(path: Path, title: str, line: int, body: list[tuple[int, str]],
          params: tuple[Param, ...]) -> Step:
    narration: list[tuple[int, str]] = []
    ops: list[Op] = []
    checks: list[Check] = []
    question: Question | None = None
    inputs: list[str] = []
    i = 0
    while i < len(body):
        num, text = body[i]
        fence = FENCE.match(text.strip())
        kind = fence.group(1) if fence else None
        if kind not in ("ops", "check", "question", "input"):
            narration.append(body[i])
            i += 1
            continue
        block: list[tuple[int, str]] = []
        i += 1
        while i < len(body) and body[i][1].strip() != "```":
            block.append(body[i])
            i += 1
        if i == len(body):
            raise LessonError(path, num, f"the ```{kind} block is not closed with ```")
        i += 1
        if kind == "ops":
            ops += [parse_op(path, n, s) for n, s in block if s.strip() and not s.strip().startswith("#")]
        elif kind == "check":
            checks += [_check(path, n, s) for n, s in block if s.strip() and not s.strip().startswith("#")]
        elif kind == "input":
            inputs += [_input(path, n, s.strip(), params, inputs) for n, s in block if s.strip()]
        else:
            if question is not None:
                raise LessonError(path, num, "a step has at most one question")
            question = _question(path, num, block)
    return Step(title, line, _text(path, narration, line + 1), tuple(ops), tuple(checks), question,
                tuple(inputs))


MAX_INPUTS = 2  # inputs a page offers: they share the slide with its text and question


def _input(path: Path, line: int, name: str, params: tuple[Param, ...], taken: list[str]) -> str:
    """A page's ```input line: the name of a param the learner may change there."""
    if name not in {p.name for p in params}:
        raise LessonError(path, line, f"```input names a param of the front matter ('params:'); "
                                      f"{name!r} is not one ({', '.join(p.name for p in params) or 'none'})")
    if name in taken or len(taken) >= MAX_INPUTS:
        raise LessonError(path, line, f"a page offers at most {MAX_INPUTS} different inputs")
    return name


def _text(path: Path, lines: list[tuple[int, str]], first_line: int) -> Text:
    exprs = []
    for num, s in lines:
        for m in PLACEHOLDER.finditer(s):
            exprs.append((m.group(1), num, parse_expr(path, num, m.group(1), "placeholder")))
        if "{{" in PLACEHOLDER.sub("", s) or "}}" in PLACEHOLDER.sub("", s):
            raise LessonError(path, num, "unbalanced '{{' or '}}' (a placeholder is '{{ expression }}' "
                                         "on one line)")
    source = "\n".join(s for _, s in lines).strip("\n")
    return Text(source, lines[0][0] if lines else first_line, tuple(exprs))


def _check(path: Path, line: int, source: str) -> Check:
    return Check(line, source.strip(), parse_expr(path, line, source, "check"))


OPTIONS = ("kind", "choices", "unit", "within")  # a question's lines between its text and answer


def _question(path: Path, line: int, block: list[tuple[int, str]]) -> Question:
    text: list[tuple[int, str]] = []
    explain: list[tuple[int, str]] = []
    options: dict[str, tuple[int, str]] = {}
    answer: tuple[int, str] | None = None
    for num, s in block:
        stripped = s.strip()
        key = stripped.partition(":")[0].strip()
        if answer is None and key == "answer":
            answer = (num, stripped[len("answer:"):].strip())
        elif answer is None and key in OPTIONS and text:
            if key in options:
                raise LessonError(path, num, f"a question has one '{key}:' line")
            options[key] = (num, stripped.partition(":")[2].strip())
        elif answer is not None and not explain and stripped.startswith("explain:"):
            explain.append((num, stripped[len("explain:"):].strip()))
        elif explain:
            explain.append((num, s))
        elif answer is None and not options:
            text.append((num, s))
        elif stripped:
            raise LessonError(path, num, "a question is its text, then 'kind:' / 'choices:' / 'unit:' / "
                                         "'within:' lines, 'answer:', and 'explain:'")
    if answer is None or not answer[1]:
        raise LessonError(path, line, "a question needs an 'answer: <expression>' line (the engine computes "
                                      "the answer)")
    if not any(s.strip() for _, s in text):
        raise LessonError(path, line, "a question needs its text before the 'answer:' line")
    tree = parse_expr(path, answer[0], answer[1], "answer")
    return Question(_text(path, text, line + 1), answer[0], answer[1], tree,
                    _text(path, explain, answer[0] + 1) if explain else None,
                    **_question_options(path, line, options))


def _question_options(path: Path, line: int, options: dict[str, tuple[int, str]]) -> dict:
    """kind (number, choice or block; choice when there are choices), its choices, unit, within:
    each checked against the kind, so a typo fails at load time."""
    choices = tuple(_text(path, [(options["choices"][0], c.strip())], options["choices"][0])
                    for c in options["choices"][1].split("|")) if "choices" in options else ()
    kind = options.get("kind", (line, "choice" if choices else "number"))
    if kind[1] not in KINDS:
        raise LessonError(path, kind[0], f"a question's kind is one of {', '.join(KINDS)}, got {kind[1]!r}")
    where = options.get("choices", kind)[0]
    if (kind[1] == "choice") != bool(choices):
        raise LessonError(path, where, "a choice question lists its 'choices: a | b | c'; other kinds "
                                       "have none")
    if choices and not 2 <= len(choices) <= MAX_CHOICES or len({c.source for c in choices}) < len(choices):
        raise LessonError(path, where, f"a choice question has 2 to {MAX_CHOICES} different choices, "
                                       "separated by '|'")
    if any(not c.source for c in choices):
        raise LessonError(path, where, "a choice is empty (two '|' in a row?)")
    out: dict = {"kind": kind[1], "choices": choices}
    for key in ("unit", "within"):
        if key in options and kind[1] != "number":
            raise LessonError(path, options[key][0], f"'{key}:' is for number questions")
    if "unit" in options:
        out["unit"] = options["unit"][1]
    if "within" in options:
        try:
            out["within"] = parse_within(options["within"][1])
        except ValueError as e:
            raise LessonError(path, options["within"][0], str(e)) from None
    return out


# ---- static name checks ---------------------------------------------------------------------------


def check_names(lesson: Lesson, known: set[str]) -> None:
    """Every name an expression reads must be a context name, a helper, a param or bound earlier."""
    bound = set(known) | {p.name for p in lesson.params}

    def check(tree: ast.Expression, line: int, where: str, names: set[str]) -> None:
        missing = sorted(free_names(tree) - names)
        if missing:
            raise LessonError(lesson.path, line, f"unknown name(s) {', '.join(missing)} in {where} "
                                                 f"(bind them earlier with 'x = ...' or 'let x = ...')")

    for _, line, tree in lesson.intro.exprs:
        check(tree, line, "the intro", bound)
    for step in lesson.steps:
        if step.question is not None:  # shown before the step runs
            for text in (step.question.text, *step.question.choices):
                for _, line, tree in text.exprs:
                    check(tree, line, "a question", bound)
        for op in step.ops:
            for tree in op.args + tuple(t for _, t in op.kwargs):
                check(tree, op.line, f"'{op.source}'", bound)
            if op.target:
                bound.add(op.target)
        for _, line, tree in step.narration.exprs:
            check(tree, line, "the narration", bound)
        for c in step.checks:
            check(c.tree, c.line, "a check", bound)
        if step.question is not None:
            check(step.question.answer, step.question.answer_line, "an answer", bound)
            if step.question.explain is not None:
                for _, line, tree in step.question.explain.exprs:
                    check(tree, line, "an explanation", bound)


def lesson_files(directory: str | Path | None = None) -> list[Path]:
    directory = Path(directory) if directory is not None else Path(__file__).parent
    return sorted(p for p in directory.glob("*.md") if p.name.lower() != "readme.md")
