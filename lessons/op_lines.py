"""Reading one line of a lesson's ```ops block into an Op: the bound name, `expect_error`, the
verb (checked against lessons/verbs.py: its arguments and options) and the argument expressions,
parsed by the safe evaluator's parser so a typo fails at load time with the file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lessons.lesson import LessonError, Op
from lessons.safe_eval import UnsafeExpression, parse
from lessons.verbs import VERBS

BIND = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\s*=\s*(?!=)(.*)$")
KWARG = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)=(?!=)(.*)$", re.S)


def parse_expr(path: Path, line: int, source: str, what: str) -> ast.Expression:
    """An expression of the lesson, parsed (and refused with its line if unsafe or malformed)."""
    try:
        return parse(source)
    except UnsafeExpression as e:
        raise LessonError(path, line, f"bad {what} {source.strip()!r}: {e}") from None


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


def parse_op(path: Path, line: int, source: str) -> Op:
    """One line of an ```ops block: `[x =] [expect_error] verb args... name=value...`."""
    text = source.strip()
    target = None
    if text.startswith("let "):  # `let x = expression`: bind a value computed now
        m = BIND.match(text[4:].strip())
        if not m:
            raise LessonError(path, line, "let reads 'let name = expression'")
        tree = parse_expr(path, line, m.group(2), "let expression")
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
    if name not in VERBS or name == "let":
        raise LessonError(path, line, f"unknown operation {name!r}; operations: "
                                      f"{', '.join(sorted(VERBS))}")
    verb = VERBS[name]
    positional, keywords, binds = verb.positional, verb.keywords, verb.binds
    args: list[ast.Expression] = []
    kwargs: list[tuple[str, ast.Expression]] = []
    for head, expr in _group(rest):
        if head is not None:
            if head not in keywords:
                raise LessonError(path, line, f"{name} has no option {head!r}; options: "
                                              f"{', '.join(sorted(keywords)) or 'none'}")
            kwargs.append((head, parse_expr(path, line, expr, f"{head}= value")))
        else:
            if kwargs:
                raise LessonError(path, line, f"{name}: positional argument {expr!r} after an option")
            args.append(parse_expr(path, line, expr, "argument"))
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
