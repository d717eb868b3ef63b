"""A lesson page as the class reads it: a short lead always on screen (the step's first
paragraph: what to look at and why, and the engine's answer to the question asked before it),
the rest folded under "More" so the page fits beside the picture on a projector."""

from __future__ import annotations

import re
from typing import Any

MORE = "More: the details"
LEAD_WORDS = 45  # about three lines beside the picture on a 1280 x 720 projector
# a sentence ends at . ! or ? before a space and a capital, a quote, bold or a bracket
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"“*(])")


def split_lead(markdown: str, most_words: int = LEAD_WORDS) -> tuple[str, str]:
    """(lead, the rest) of a step's narration: the lead is the first paragraph's first sentences,
    as many as fit in `most_words` (always one); the rest keeps every other word, in order."""
    parts = markdown.strip().split("\n\n", 1)
    first, rest = parts[0], (parts[1].strip() if len(parts) > 1 else "")
    if first.rstrip().endswith(":") and rest:  # "The 3 samples finished:" and the list it opens
        more = rest.split("\n\n", 1)
        if len(first.split()) + len(more[0].split()) <= most_words:
            return f"{first}\n\n{more[0]}", (more[1].strip() if len(more) > 1 else "")
    sentences = SENTENCE_END.split(first)
    lead, words = [], 0
    for i, sentence in enumerate(sentences):
        n = len(sentence.split())
        if lead and words + n > most_words:
            tail = " ".join(sentences[i:])
            return " ".join(lead), (tail + "\n\n" + rest).strip()
        lead.append(sentence)
        words += n
    return " ".join(lead), rest


def page_markdown(step: Any) -> str:
    """The page's Markdown: title, lead, the answer if a question was asked, then the folded
    rest (the narration's other paragraphs and the answer's explanation)."""
    lead, rest = split_lead(step.narration_markdown)
    text = f"### {step.title}\n\n{lead}"
    if step.question:
        text += f"\n\n**Question:** {step.question}  \n**The engine's answer:** {step.answer_text}"
    folded = "\n\n".join(p for p in (rest, step.explanation or "") if p)
    if folded:
        text += f"\n\n<details><summary>{MORE}</summary>\n\n{folded}\n\n</details>"
    return text
