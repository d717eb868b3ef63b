"""A teacher in presenter mode, and a learner going from one lesson to the next, in Chromium on
the default model (issue 42, items 1 and 7):

- presenter mode ticked first, then the Lessons tab: the lesson list and Start are on the slide,
  the opening page (page 0) is a slide like every other page, and Next on the last page says
  what to do instead of nothing;
- a block selected in one lesson is not selected in the next one (neither in its picture nor
  in the prefix tree under it).

Every wait is on a condition that is false, never an error, while the page renders."""

from __future__ import annotations

import os

import pytest

from tests.ui.test_browser import CHROMIUM, IDLE, click_cell, open_page
from tests.ui.test_slides_browser import FITTED, PROGRESS, SLIDE

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="Debian's chromium is not installed (scripts/test.sh installs it)")]
SMALL = {"width": 1280, "height": 720}
# the visible toasts' text (Gradio's message boxes)
TOASTS = ("() => [...document.querySelectorAll('.toast-item')].filter((t) => t.offsetParent !== null)"
          ".map((t) => t.innerText.replace(/\\s+/g, ' ')).join(' | ')")


def start(pg, title: str) -> None:
    """Choose a lesson in the list and press Start: its opening page."""
    pg.locator("#lesson-choose input").first.click()
    pg.get_by_role("option", name=title).click()
    before = pg.evaluate(PROGRESS)
    pg.click("#lesson-start")
    pg.wait_for_function(f"(b) => {{ const t = ({PROGRESS})(); return t.includes('page 0 of') "
                         f"&& t !== b && ({IDLE})(); }}", arg=before, timeout=180_000)


def turn(pg) -> str:
    before = pg.evaluate(PROGRESS)
    pg.click("#lesson-next")
    pg.wait_for_function(f"(b) => ({PROGRESS})() !== b && ({IDLE})()", arg=before, timeout=180_000)
    return pg.evaluate(PROGRESS)


def test_presenter_mode_first_then_a_lesson_from_its_list_to_its_end(browser, served_app):
    pg = open_page(browser, served_app, SMALL)
    try:
        pg.click("#presenter")
        pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")
        pg.get_by_role("tab", name="Lessons").click()
        pg.wait_for_function("() => document.body.classList.contains('pl-lesson')")
        # the slide offers the lesson list and Start (they were hidden: nothing to start with)
        for sel in ("#lesson-choose input", "#lesson-start"):
            pg.wait_for_function("(s) => document.querySelector(s)?.offsetParent != null", arg=sel)
        start(pg, "2. Paging: blocks and tables")
        size = [SMALL["width"], SMALL["height"]]
        pg.wait_for_function(f"(s) => ({FITTED})(s) && ({SLIDE})() !== null && ({IDLE})()",
                             arg=size, timeout=120_000)
        assert pg.evaluate(SLIDE) == []  # the opening page is a slide: no scroll, large type
        # once the lesson runs, its slide keeps to the page: the list goes
        turn(pg)
        pg.wait_for_function("() => document.querySelector('#lesson-choose')?.offsetParent == null")
        while "the end" not in pg.evaluate(PROGRESS):
            turn(pg)
        pg.click("#lesson-next")  # Next on the last page: said, not silent
        said = pg.wait_for_function(f"() => ({TOASTS})() || null", timeout=60_000).json_value()
        assert "last page" in said and "Restart" in said
        assert pg.evaluate("document.querySelector('#lesson-start')?.offsetParent != null")
        assert pg.console_errors == []
    finally:
        pg.close()


def test_a_block_selected_in_one_lesson_is_not_selected_in_the_next(browser, served_app):
    pg = open_page(browser, served_app, {"width": 1440, "height": 900})
    try:
        pg.get_by_role("tab", name="Lessons").click()
        start(pg, "3. Fork and copy-on-write")
        turn(pg)  # a sequence in the pool: its blocks can be clicked
        click_cell(pg, ["pool", 0])
        pg.wait_for_function("() => document.querySelector('#inspector-note')?.innerText"
                             ".includes('Block 0')", timeout=60_000)
        pg.click("#inspector > .label-wrap")  # closed, as a learner does to reach the list
        pg.wait_for_function("() => !document.querySelector('#inspector > .label-wrap.open')")
        start(pg, "5. Prefix caching")
        for _ in range(4):  # lesson 5 draws its prefix cache as a tree under the picture
            turn(pg)
            traces = pg.evaluate("() => ['#pool-plot', '#view-plot'].flatMap((s) => document"
                                 ".querySelector(s + ' .js-plotly-plot')?.data?.map((t) => t.name) ?? [])")
            assert "selected" not in traces, traces
        assert pg.console_errors == []
    finally:
        pg.close()
