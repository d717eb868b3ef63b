"""Reading a lesson file: front matter, steps, narration with `{{ ... }}` placeholders, ops, checks,
questions. Everything is parsed and checked at load time, so a typo fails with file and line
before a class sees it, not in the middle of a lesson.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine import EngineConfig
from lessons.safe_eval import UnsafeExpression, free_names, parse

PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}")
STEP_HEADING = re.compile(r"^##\s+Step:\s*(.*\S)\s*$")
FENCE = re.compile(r"^```\s*([A-Za-z_]*)\s*$")
BIND = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\s*=\s*(?!=)(.*)$")
KWARG = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)=(?!=)(.*)$", re.S)

ENGINE_KEYS = {"model", "block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching",
               "preemption_mode", "seed", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
               "enable_chunked_prefill"}

#: op name -> (positional argument names, allowed keywords, binds a result?)
OPS: dict[str, tuple[tuple[str, ...], frozenset[str], bool]] = {
    "add_sequence": (("prompt",), frozenset(), True),
    "append": (("seq",), frozenset({"n", "tokens", "text"}), False),
    "fork": (("seq",), frozenset(), True),
    "free": (("seq", "*"), frozenset(), False),
    "request": (("prompt",), frozenset({"max_tokens", "temperature", "top_p", "top_k", "n", "beam_width",
                                        "length_penalty", "seed", "stop", "ignore_eos"}), True),
    "step": ((), frozenset({"times"}), True),
    "run": ((), frozenset({"max_steps", "until"}), True),
    "let": (("value",), frozenset(), True),
    "probe": (("seq",), frozenset({"layer"}), True),
    "admit": (("workload",), frozenset(), True),
    "engine": ((), ENGINE_KEYS - {"model"}, False),
}


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
    text: Text
    answer_line: int
    answer_source: str
    answer: ast.Expression
    explain: Text | None


@dataclass(frozen=True)
class Step:
    title: str
    line: int
    narration: Text
    ops: tuple[Op, ...] = ()
    checks: tuple[Check, ...] = ()
    question: Question | None = None


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
    meta, body_start = _front_matter(path, lines)
    title = _required_str(path, meta, "title")
    summary = _required_str(path, meta, "summary")
    config, dry_reason = _engine_config(path, meta)
    params = _params(path, meta)
    intro, steps = _body(path, lines, body_start)
    if not steps:
        raise LessonError(path, body_start + 1, "the lesson has no steps (start one with '## Step: a title')")
    lesson = Lesson(path, title, summary, config, tuple(steps), intro, dry_reason, params, meta)
    if known_names is not None:
        check_names(lesson, known_names)
    return lesson


def _front_matter(path: Path, lines: list[str]) -> tuple[dict[str, Any], int]:
    if not lines or lines[0].strip() != "---":
        raise LessonError(path, 1, "a lesson starts with front matter between '---' lines "
                                   "(title, summary, engine)")
    for end in range(1, len(lines)):
        if lines[end].strip() == "---":
            break
    else:
        raise LessonError(path, 1, "the front matter is not closed with a '---' line")
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 2 if mark is not None else 2
        raise LessonError(path, line, f"front matter is not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(meta, dict):
        raise LessonError(path, 2, "the front matter must be 'key: value' lines")
    known = {"title", "summary", "engine", "dry_reason", "params"}
    unknown = sorted(set(meta) - known)
    if unknown:
        raise LessonError(path, 2, f"unknown front matter key(s): {', '.join(unknown)}; "
                                   f"expected {', '.join(sorted(known))}")
    return meta, end + 1


def _required_str(path: Path, meta: dict[str, Any], key: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value.strip():
        raise LessonError(path, 2, f"the front matter needs a '{key}' (text)")
    return value.strip()


def _engine_config(path: Path, meta: dict[str, Any]) -> tuple[EngineConfig, str]:
    engine = meta.get("engine")
    if not isinstance(engine, dict):
        raise LessonError(path, 2, "the front matter needs an 'engine' mapping (model, block_size, "
                                   "num_gpu_blocks, ...)")
    unknown = sorted(set(engine) - ENGINE_KEYS)
    if unknown:
        raise LessonError(path, 2, f"unknown engine key(s): {', '.join(unknown)}; "
                                   f"expected some of {', '.join(sorted(ENGINE_KEYS))}")
    values = dict(engine)
    model = values.get("model", "default")
    if model in ("dry", None):
        values["model"] = None
    dry_reason = str(meta.get("dry_reason") or "").strip()
    if values["model"] is None and not dry_reason:
        raise LessonError(path, 2, "a dry lesson must say why in 'dry_reason' (lessons run on the real "
                                   "model unless there is a reason not to)")
    try:
        config = EngineConfig(**values)
    except (TypeError, ValueError) as e:
        raise LessonError(path, 2, f"bad engine config: {e}") from None
    return config, dry_reason


def _params(path: Path, meta: dict[str, Any]) -> tuple[Param, ...]:
    raw = meta.get("params") or {}
    if not isinstance(raw, dict):
        raise LessonError(path, 2, "'params' must map a name to {label, choices, default}")
    out = []
    for name, spec in raw.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("choices"), list) or not spec["choices"]:
            raise LessonError(path, 2, f"param {name!r} needs a non-empty 'choices' list")
        default = spec.get("default", spec["choices"][0])
        if default not in spec["choices"]:
            raise LessonError(path, 2, f"param {name!r}: default {default!r} is not one of its choices")
        out.append(Param(str(name), str(spec.get("label", name)), tuple(spec["choices"]), default))
    return tuple(out)


def _body(path: Path, lines: list[str], start: int) -> tuple[Text, list[Step]]:
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
    return intro, [_step(path, title, line, body) for title, line, body in sections[1:] if title]


def _step(path: Path, title: str, line: int, body: list[tuple[int, str]]) -> Step:
    narration: list[tuple[int, str]] = []
    ops: list[Op] = []
    checks: list[Check] = []
    question: Question | None = None
    i = 0
    while i < len(body):
        num, text = body[i]
        fence = FENCE.match(text.strip())
        kind = fence.group(1) if fence else None
        if kind not in ("ops", "check", "question"):
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
            ops += [_op(path, n, s) for n, s in block if s.strip() and not s.strip().startswith("#")]
        elif kind == "check":
            checks += [_check(path, n, s) for n, s in block if s.strip() and not s.strip().startswith("#")]
        else:
            if question is not None:
                raise LessonError(path, num, "a step has at most one question")
            question = _question(path, num, block)
    return Step(title, line, _text(path, narration, line + 1), tuple(ops), tuple(checks), question)


def _text(path: Path, lines: list[tuple[int, str]], first_line: int) -> Text:
    exprs = []
    for num, s in lines:
        for m in PLACEHOLDER.finditer(s):
            exprs.append((m.group(1), num, _parse(path, num, m.group(1), "placeholder")))
        if "{{" in PLACEHOLDER.sub("", s) or "}}" in PLACEHOLDER.sub("", s):
            raise LessonError(path, num, "unbalanced '{{' or '}}' (a placeholder is '{{ expression }}' "
                                         "on one line)")
    source = "\n".join(s for _, s in lines).strip("\n")
    return Text(source, lines[0][0] if lines else first_line, tuple(exprs))


def _parse(path: Path, line: int, source: str, what: str) -> ast.Expression:
    try:
        return parse(source)
    except UnsafeExpression as e:
        raise LessonError(path, line, f"bad {what} {source.strip()!r}: {e}") from None


def _check(path: Path, line: int, source: str) -> Check:
    return Check(line, source.strip(), _parse(path, line, source, "check"))


def _question(path: Path, line: int, block: list[tuple[int, str]]) -> Question:
    text: list[tuple[int, str]] = []
    explain: list[tuple[int, str]] = []
    answer: tuple[int, str] | None = None
    for num, s in block:
        stripped = s.strip()
        if answer is None and stripped.startswith("answer:"):
            answer = (num, stripped[len("answer:"):].strip())
        elif answer is not None and not explain and stripped.startswith("explain:"):
            explain.append((num, stripped[len("explain:"):].strip()))
        elif explain:
            explain.append((num, s))
        elif answer is None:
            text.append((num, s))
        elif stripped:
            raise LessonError(path, num, "after 'answer:' comes 'explain:' (or the end of the question)")
    if answer is None or not answer[1]:
        raise LessonError(path, line, "a question needs an 'answer: <expression>' line (the engine computes "
                                      "the answer)")
    if not any(s.strip() for _, s in text):
        raise LessonError(path, line, "a question needs its text before the 'answer:' line")
    tree = _parse(path, answer[0], answer[1], "answer")
    return Question(_text(path, text, line + 1), answer[0], answer[1], tree,
                    _text(path, explain, answer[0] + 1) if explain else None)


def split_args(text: str) -> list[str]:
    """Split an op's arguments on top-level spaces, keeping quoted strings and brackets whole."""
    parts: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            cur.append(c)
            if c == "\\" and i + 1 < len(text):
                cur.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
            cur.append(c)
        elif c in "([{":
            depth += 1
            cur.append(c)
        elif c in ")]}":
            depth -= 1
            cur.append(c)
        elif c.isspace() and depth == 0:
            if cur:
                parts.append("".join(cur))
                cur = []
        else:
            cur.append(c)
        i += 1
    if quote:
        raise ValueError("a quoted string is not closed")
    if depth != 0:
        raise ValueError("brackets do not balance")
    if cur:
        parts.append("".join(cur))
    return parts


def _op(path: Path, line: int, source: str) -> Op:
    text = source.strip()
    target = None
    if text.startswith("let "):  # `let x = expression`: bind a value computed now
        m = BIND.match(text[4:].strip())
        if not m:
            raise LessonError(path, line, "let reads 'let name = expression'")
        tree = _parse(path, line, m.group(2), "let expression")
        return Op(line, "let", m.group(1), (tree,), (), False, text)
    m = BIND.match(text)
    if m:
        target, text = m.group(1), m.group(2).strip()
    expect_error = False
    if text.startswith("expect_error "):
        expect_error, text = True, text[len("expect_error "):].strip()
    try:
        words = split_args(text)
    except ValueError as e:
        raise LessonError(path, line, f"cannot read the operation: {e}") from None
    if not words:
        raise LessonError(path, line, "empty operation")
    name, rest = words[0], words[1:]
    if name not in OPS or name == "let":
        raise LessonError(path, line, f"unknown operation {name!r}; operations: "
                                      f"{', '.join(sorted(OPS))}")
    positional, keywords, binds = OPS[name]
    args: list[ast.Expression] = []
    kwargs: list[tuple[str, ast.Expression]] = []
    for head, expr in _group(rest):
        if head is not None:
            if head not in keywords:
                raise LessonError(path, line, f"{name} has no option {head!r}; options: "
                                              f"{', '.join(sorted(keywords)) or 'none'}")
            kwargs.append((head, _parse(path, line, expr, f"{head}= value")))
        else:
            if kwargs:
                raise LessonError(path, line, f"{name}: positional argument {expr!r} after an option")
            args.append(_parse(path, line, expr, "argument"))
    most = float("inf") if "*" in positional else len(positional)
    least = len([p for p in positional if p != "*"])
    if not least <= len(args) <= most:
        want = " ".join(p for p in positional if p != "*") or "no arguments"
        raise LessonError(path, line, f"{name} takes {want}, got {len(args)} argument(s)")
    if target is not None and not binds and not expect_error:
        raise LessonError(path, line, f"{name} returns nothing to bind to {target!r}")
    if name == "append" and len(kwargs) > 1:
        raise LessonError(path, line, "append takes one of n=, tokens= or text=")
    return Op(line, name, target, tuple(args), tuple(kwargs), expect_error, source.strip())


def _group(words: list[str]) -> list[tuple[str | None, str]]:
    """Join space-separated words back into arguments: each argument is the longest run of words
    that parses as one expression, so `add_sequence system + " Hi"` is one argument and
    `free a b` two. Returns (option name or None, expression text) pairs."""
    out: list[tuple[str | None, str]] = []
    i = 0
    while i < len(words):
        kw = KWARG.match(words[i])
        head, first = (kw.group(1), kw.group(2)) if kw else (None, words[i])
        j = i + 1
        while j < len(words) and not KWARG.match(words[j]):
            j += 1
        best = i + 1
        for end in range(j, i + 1, -1):  # longest first
            try:
                ast.parse(" ".join([first, *words[i + 1:end]]), mode="eval")
            except SyntaxError:
                continue
            best = end
            break
        out.append((head, " ".join([first, *words[i + 1:best]])))
        i = best
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
            for _, line, tree in step.question.text.exprs:
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
