"""The reader of a page's claims (tests/lessons/page_claims.py) on a page whose picture holds
what its text says. Every page of every lesson is checked against its picture as it plays:
tests/lessons/test_lessons.py's test_lesson_plays_to_the_end (one play a lesson, not two)."""

from __future__ import annotations

from lessons import LessonRun, load_all
from tests.lessons.page_claims import BOX, problems, shown
from ui.lesson_pages import page_picture

LESSONS = {lesson.name: lesson for lesson in load_all()}


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
