"""Every page of every lesson: what its text says of the picture, the picture shows (issue 42).

Each page's picture is drawn as the page draws it on a projector at 1280 x 720
(ui/lesson_player.page_picture, in presenter mode, fitted to the slide's box; every block drawn
where the page asks which block), and its text, the narration and the question the page asks of
that picture, is read for the claims tests/lessons/page_claims.py knows: the blocks it names,
rolled-back and kept drafts, evictions and copies, the pending token, counts of used, free and
cached blocks, how full a last block is. The lessons run on the engines they name (dry or the
real model), with their default inputs."""

from __future__ import annotations

import pytest

from lessons import LessonRun, load_all
from tests.lessons.page_claims import problems, shown
from ui.lesson_ask import asks_block
from ui.lesson_pages import page_picture

LESSONS = {lesson.name: lesson for lesson in load_all()}
BOX = (766, 666)  # the picture's box on a 1280 x 720 slide (presenter mode, a lesson in front)


def _pages(run: LessonRun):
    """(where, text, figure) for the opening and every page, as the page shows them."""
    while True:
        step = run.current
        q = run.question_for_next()
        ask = q.text if q is not None and q.verdict is None else ""
        text = (run.intro_markdown() if step is None else step.narration_markdown) + "\n\n" + ask
        fig = page_picture(run, step, True, BOX, every_block=asks_block(run))
        yield f"{run.lesson.name} page {run.index}", text, fig
        if run.done:
            return
        run.next()


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if lesson.dry else [pytest.mark.slow])
                                  for n, lesson in LESSONS.items()])
def test_each_pages_text_agrees_with_its_picture(name: str, request) -> None:
    if not LESSONS[name].dry:
        request.getfixturevalue("default_model")  # the shared weights, loaded once
    run = LessonRun(LESSONS[name])
    found: list[str] = []
    try:
        for where, text, fig in _pages(run):
            found += [f"{where}: {p}" for p in problems(text, fig)]
    finally:
        run.close()
    assert not found, "\n".join(found)


def test_the_claims_are_read_off_the_picture() -> None:
    """The reader itself, on a page whose picture holds what its text says (lesson 2 at its
    block question, dry-run free): blocks, counts and a full last block."""
    run = LessonRun(LESSONS["08_block_size"])
    view = run.next()
    fig = page_picture(run, view, True, BOX)
    s = shown(fig)
    assert s.tables and all(rows for rows in s.tables.values())
    used = sum(1 for state in s.states.values() if state == "used")
    assert used == view.snapshot.metrics.used_blocks
    assert problems(f"{used} of {view.snapshot.num_blocks} blocks are used", fig) == []
    assert problems(f"{used + 1} of {view.snapshot.num_blocks} blocks are used", fig)
    assert problems("block 9999 is named", fig)
