"""A lesson polled in a room, in Chromium (issue 42): the teacher at 1280 x 720, a student on a
390 x 844 phone. After a reveal, the phone's box for the next question is empty (it held the
student's previous answer, which one press of Answer sent again); a block question tells a phone,
which has no picture, to type the block's id. Waits are on conditions that never throw."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import open_room_page

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")]
POLL = "() => document.querySelector('#room-poll')?.innerText ?? ''"
POLL_ASK = "() => document.querySelector('#room-poll-ask')?.innerText ?? ''"
STUDENT_POLL = "() => document.querySelector('#student-poll')?.innerText ?? ''"
ANSWER_BOX = "#student-answer input, #student-answer textarea"


def _play(teacher, lesson: str) -> None:
    """Play `lesson` in the room (its title picked in the list) and show its first page."""
    teacher.locator("#room-lesson input").first.fill(lesson)
    teacher.keyboard.press("Enter")
    teacher.click("#room-lesson-play")
    teacher.wait_for_function(f"() => ({POLL})().includes('page 0 of')", timeout=120_000)
    teacher.click("#room-lesson-next")
    teacher.wait_for_function(f"() => ({POLL_ASK})().includes('Predict')", timeout=120_000)


def test_after_a_reveal_the_next_questions_box_is_empty(served_app, browser):
    teacher = browser.new_page(viewport={"width": 1280, "height": 720})
    phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        code = open_room_page(teacher, served_app)
        _play(teacher, "3. Fork and copy-on-write")
        phone.goto(served_app + f"room?code={code}")
        phone.wait_for_function(f"() => ({STUDENT_POLL})().includes('How many new blocks')",
                                timeout=60_000)
        phone.locator(ANSWER_BOX).first.fill("0")
        phone.click("#student-answer-send")
        phone.wait_for_function(f"() => ({STUDENT_POLL})().includes('Your answer: 0')", timeout=60_000)
        teacher.click("#room-lesson-next")  # the reveal; the block question opens with it
        phone.wait_for_function(f"() => ({STUDENT_POLL})().includes('You predicted 0')"
                                f" && ({STUDENT_POLL})().includes('Which block')", timeout=120_000)
        phone.wait_for_function("(s) => !!document.querySelector(s)", arg=ANSWER_BOX, timeout=60_000)
        assert phone.locator(ANSWER_BOX).first.input_value() == ""
        asked = phone.evaluate(STUDENT_POLL)
        # a phone has no picture: the block question says to type the id, not to click
        assert "Click it" not in asked and "type" in asked.lower(), asked
        phone.screenshot(path="/tmp/poll-phone-next-question.png")
    finally:
        teacher.close()
        phone.close()


TOAST = "() => [...document.querySelectorAll('[data-testid=toast-body]')].map((t) => t.innerText).join(' | ')"


def test_a_projector_opened_by_its_code_says_why_next_does_nothing(served_app, browser):
    """Issue 42, item 10: a projector that opened the room by its code (no secret) pressed Next:
    nothing happened and nothing was said (the refusal went to a line the projector view hides)."""
    teacher = browser.new_page(viewport={"width": 1280, "height": 720})
    projector = browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        code = open_room_page(teacher, served_app)
        _play(teacher, "2. Paging: blocks and tables")
        projector.goto(served_app + f"class?code={code}")
        projector.wait_for_function(f"() => ({POLL})().includes('page 1 of')", timeout=120_000)
        projector.click("#room-projector")
        projector.wait_for_function("() => document.body.classList.contains('pl-projector')",
                                    timeout=30_000)
        projector.click("#room-lesson-next")
        projector.wait_for_function(f"() => /secret/i.test(({TOAST})())", timeout=60_000)
        said = projector.evaluate(TOAST)
        assert "projector view" in said, said  # where to type it: the box the view hides
        assert "page 1 of" in projector.evaluate(POLL)  # nothing moved
    finally:
        teacher.close()
        projector.close()
