"""What a lesson page's text claims about its picture, and what the picture shows (issue 42: the
text and the picture are checked against each other on every page, not only lesson 12's).

`page_problems(run)` draws the page a lesson run is on as a projector shows it and checks its
text against that picture. `shown(fig)` reads the picture as drawn (the figure the page sends):
the blocks drawn and each one's state, the table rows, the pending marks, the struck-out drafts
and the kept ones, the marks of the step's events (each mapped back to the block it outlines).
`problems(text, fig)` finds the claims of the page's text (the narration, and the question the
page asks of its own picture) by the sentence forms the lessons use, and says where the picture
disagrees.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

BOX = (766, 666)  # the picture's box on a 1280 x 720 slide (presenter mode, a lesson in front)
IDS = r"(\d+(?:(?:, | and |, and )\d+)*)"  # "0, 1, 2 and 5"
ROW_GAP = 0.5  # a mark's y within this of a row's centre belongs to that row


@dataclass
class Shown:
    states: dict[int, str] = field(default_factory=dict)  # every drawn block -> its state
    folded: int = 0  # free blocks folded into labelled rows ("blocks 2-23 free")
    tables: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # seq -> [(block, filled)]
    pending: list[str] = field(default_factory=list)  # texts drawn with the pending mark ▸
    struck: list[str] = field(default_factory=list)  # rejected draft tokens, struck out
    kept: int = 0  # draft slots outlined as kept
    marks: dict[str, set[int]] = field(default_factory=dict)  # event mark -> blocks it outlines
    arrows: list[tuple[int | None, int | None]] = field(default_factory=list)  # copy-on-write


def _ids(words: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", words)]


def _boxes(trace: Any) -> list[list[tuple[float, float]]]:
    """A None-separated line trace's pieces, each a list of (x, y)."""
    out, cur = [], []
    for x, y in zip(trace.x, trace.y, strict=True):
        if x is None:
            out.append(cur) if cur else None
            cur = []
        else:
            cur.append((x, y))
    return out + ([cur] if cur else [])


def _block_at(fig: Any, x: float, y: float) -> int | None:
    """The block whose drawn strip (or id cell) holds the point (x, y), in plot units."""
    for t in fig.data:
        if t.name not in ("pool", "free blocks") or t.type != "heatmap":
            continue
        for r, yc in enumerate(t.y):
            if abs(yc - y) > ROW_GAP:
                continue
            row = [(c, cd) for c, cd in enumerate(t.customdata[r]) if cd]
            for c, cd in row:  # a strip runs from its label cell to its last slot
                if t.x[c] - 0.35 <= x <= t.x[c + 1] + 0.35:
                    return cd[0]
    return None


def shown(fig: Any) -> Shown:
    s = Shown()
    for t in fig.data:
        if t.name in ("pool", "free blocks") and t.type == "heatmap":
            for row in t.customdata:
                for cd in row:
                    if cd and (m := re.match(r"block (\d+) · (\w+)", cd[1])):
                        s.states[int(m.group(1))] = m.group(2)
            s.pending += [x for row in t.text for x in row if x and x.startswith("▸")]
        elif t.name == "block tables":
            for crow, trow in zip(t.customdata, t.text, strict=True):
                for cd, tx in zip(crow, trow, strict=True):
                    if tx and tx.startswith("▸"):
                        s.pending.append(tx)
                    m = cd and re.search(r"(?:physical|CPU) block (\d+), (\d+)/\d+ filled", cd[1])
                    if m:
                        s.tables.setdefault(cd[0], []).append((int(m.group(1)), int(m.group(2))))
        elif t.name == "rejected tokens":
            s.struck += [re.sub("</?s>", "", x).strip() for x in t.text]
        elif t.name == "draft kept":
            s.kept = len(_boxes(t))
        elif t.name in ("new block", "evicted", "freed", "prefix hit"):
            s.marks[t.name] = {b for box in _boxes(t)
                               if (b := _block_at(fig, sum(x for x, _ in box[:4]) / 4,
                                                  sum(y for _, y in box[:4]) / 4)) is not None}
        elif t.name == "copy-on-write":
            s.arrows += [(_block_at(fig, *p[0]), _block_at(fig, *p[-1])) for p in _boxes(t)]
    for a in fig.layout.annotations:
        if m := re.match(r"blocks (\d+)–(\d+) free", a.text or ""):
            s.folded += int(m.group(2)) - int(m.group(1)) + 1
    return s


def _plain(text: str) -> str:
    """The text as read: no emphasis, no quote marks at line starts, one line."""
    text = re.sub(r"(?m)^>\s?", "", text.replace("**", "").replace("_", " "))
    return re.sub(r"\s+", " ", text)


def problems(text: str, fig: Any) -> list[str]:
    """Where the picture disagrees with what `text` says of it."""
    s, text = shown(fig), _plain(text)
    out: list[str] = []
    count = Counter(s.states.values())
    count["free"] += s.folded
    # 1. a block the text names by its physical id is on the picture ("block 3 (#5)": logical 3)
    named = [int(m) for m in re.findall(r"\(#(\d+)\)", text)]
    rest = re.sub(r"\bblock \d+ \(#\d+\)", "", text)
    for m in re.finditer(r"\b(?:[Bb]locks?|tables? is(?: now)?|[Bb]lock table is) " + IDS, rest):
        named += _ids(m.group(1))
    out += [f"names block {b}, which the picture does not draw" for b in dict.fromkeys(named)
            if b not in s.states]
    # 2. drafts: the rolled-back tokens struck out, the kept slots outlined
    for m in re.finditer(r"(\d+) slots? rolled back \(([^)]*)\)", text):
        said = [ast.literal_eval(t).strip() for t in re.findall(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"",
                                                                m.group(2))]
        if sorted(said) != sorted(s.struck):
            out.append(f"rolls back {said}; the picture strikes out {s.struck}")
    for m in re.finditer(r"kept (\d+) of \d+ draft tokens", text):
        if int(m.group(1)) != s.kept:
            out.append(f"keeps {m.group(1)} draft tokens; the picture outlines {s.kept} slots as kept")
    # 3. the step's events: evictions and copies where the text says they happened
    for m in re.finditer(r"Evicted[^:]*: " + IDS, text):
        if set(_ids(m.group(1))) != s.marks.get("evicted", set()):
            out.append(f"evicts {_ids(m.group(1))}; the picture marks {sorted(s.marks.get('evicted', ()))}")
    for m in re.finditer(r"[Bb]lock (\d+) (?:was copied to block|went to) (\d+)", text):
        if (int(m.group(1)), int(m.group(2))) not in s.arrows:
            out.append(f"copies block {m.group(1)} to {m.group(2)}; the arrows join {s.arrows}")
    # 4. the pending token, named in the text, is drawn with its mark
    for m in re.finditer(r"[“`]([^”`]+)[”`],? (?:is pending|waits as pending)", text):
        if not any(m.group(1).strip() in p for p in s.pending):
            out.append(f"names the pending token {m.group(1)!r}; the picture shows {s.pending}")
    # 5. counts of blocks by state
    for m in re.finditer(r"(\d+) of (?:the pool's )?(\d+) blocks are used", text):
        if (count["used"], len(s.states) + s.folded) != (int(m.group(1)), int(m.group(2))):
            out.append(f"says {m.group(0)}; the picture has {count['used']} of {len(s.states) + s.folded}")
    for m in re.finditer(r"(\d+) free and (\d+) cached blocks", text):
        if (count["free"], count["cached"]) != (int(m.group(1)), int(m.group(2))):
            out.append(f"says {m.group(0)}; the picture has {count['free']} free, {count['cached']} cached")
    for m in re.finditer(r"(\d+) blocks free\b", text):
        if count["free"] != int(m.group(1)):
            out.append(f"says {m.group(0)}; the picture has {count['free']} free")
    # 6. how full a sequence's last block is
    lasts = [rows[-1][1] for rows in s.tables.values() if rows]
    size = _block_size(fig)
    if re.search(r"last block is (?:already )?full", text) and size not in lasts:
        out.append(f"says a last block is full; the tables' last blocks hold {lasts} of {size}")
    if re.search(r"last block fills\b|last block has free slots|it has free slots", text) and \
            not any(n < size for n in lasts):
        out.append(f"says a last block has room; the tables' last blocks hold {lasts} of {size}")
    for m in re.finditer(r"last block holds (\d+) of (\d+) tokens", text):
        if int(m.group(1)) not in lasts:
            out.append(f"says {m.group(0)}; the tables' last blocks hold {lasts}")
    return out


def _block_size(fig: Any) -> int:
    title = fig.layout.title.text or ""  # "... 24 blocks × 4 slots ..." (a phone's: "24×4")
    m = re.search(r"(\d+) slots", title) or re.search(r"×(\d+)", title)
    return int(m.group(1)) if m else 0


def page_problems(run: Any) -> list[str]:
    """The page `run` is on (its opening, or a step), as a projector at 1280 x 720 shows it
    (ui/lesson_player.page_picture in presenter mode, fitted to the slide's box; every block drawn
    where the page asks which block): what its text, the narration and the question it asks of
    that picture, says that the picture does not show."""
    from ui.lesson_ask import asks_block
    from ui.lesson_pages import page_picture

    step, q = run.current, run.question_for_next()
    ask = q.text if q is not None and q.verdict is None else ""
    text = (run.intro_markdown() if step is None else step.narration_markdown) + "\n\n" + ask
    fig = page_picture(run, step, True, BOX, every_block=asks_block(run))
    return [f"{run.lesson.name} page {run.index}: {p}" for p in problems(text, fig)]
