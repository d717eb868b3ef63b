"""A lesson page as the class reads it: its title, its ONE key sentence (the idea of the page,
drawn large on a projector), the rest of its text, and the engine's answer to the question asked
before it. Nothing is folded away: a page is a slide, and its words are what the class must see.

The key sentence is the page's quoted paragraph (a Markdown `> ` line, lessons/README.md), or,
where the writer quoted none, its first sentence. It is rendered as a quote, which the page
styles as the key sentence (ui/theme.py)."""

from __future__ import annotations

import re
from typing import Any

# a sentence ends at . ! or ? before a space and a capital, a quote, bold or a bracket
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“*(])")


def split_key(markdown: str) -> tuple[str, str]:
    """(key sentence, the rest) of a page's Markdown: the quoted paragraph, or the first
    sentence of the first paragraph; the rest keeps every other word, in order."""
    paragraphs = [p for p in markdown.strip().split("\n\n") if p.strip()]
    for i, p in enumerate(paragraphs):
        if p.lstrip().startswith(">"):
            key = " ".join(line.strip().removeprefix(">").strip() for line in p.strip().splitlines())
            return key, "\n\n".join(paragraphs[:i] + paragraphs[i + 1:])
    if not paragraphs:
        return "", ""
    first, *rest = paragraphs
    if first.lstrip().startswith(("-", "|", "#", "1.")):  # a list or a table: no sentence to lift
        return "", markdown.strip()
    head, *tail = SENTENCE_END.split(first, 1)
    return head.strip(), "\n\n".join([*tail, *rest]).strip()


def keyed_markdown(markdown: str) -> str:
    """The text with its key sentence first, as a quote."""
    key, rest = split_key(markdown)
    return "\n\n".join(p for p in (f"> {key}" if key else "", rest) if p)


def page_markdown(step: Any, verdict: str = "") -> str:
    """The page's Markdown: title, key sentence, the rest, then the answer to the question asked
    before it (on the page before): the engine's, the learner's verdict (lessons/questions.py)
    and why. Without a verdict (a page read outside the player) the question is repeated."""
    text = f"### {step.title}\n\n{keyed_markdown(step.narration_markdown)}"
    if step.question:
        why = f" {step.explanation}" if step.explanation else ""
        asked = f"**Question:** {step.question}  \n" if not verdict else ""
        said = f" {verdict}" if verdict else ""
        text += f"\n\n{asked}**The engine's answer: {step.answer_text}.**{said}{why}"
    return text
