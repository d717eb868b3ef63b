"""Quick tab clicks leave the page on the last tab clicked, whatever order their answers take.

Gradio answers a page's tab events side by side: clicking Lessons and then at once Playground,
the Lessons answer can come last and put the lesson's picture (and its status line) in front of
the Playground, its timeline hidden. Each tab event carries the page's clock as it was sent, and
an answer to a tab that a later click left draws nothing; the Playground's tools are shown by
the page itself. Here Chromium holds the Lessons tab's request until the Playground's answer is
on screen, and only then lets it go.

A dry app (no model) and a dry lesson (07_fragmentation).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import ServedUrl, serve_app
from tests.helpers import QueueTraffic, wait_until
from tests.ui.test_browser import CHROMIUM, IDLE

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="Debian's chromium is not installed (scripts/test.sh installs it)")]

STATUS = "() => document.querySelector('#status')?.innerText ?? ''"
TOOLS_SHOWN = "() => document.querySelector('#playground-tools')?.offsetParent != null"
ON_LESSONS = """() => (window.gradio_config?.dependencies ?? [])
  .filter((d) => d.api_name === 'on_lessons').map((d) => d.id)"""


@pytest.fixture(scope="module")
def app_url() -> Iterator[ServedUrl]:
    yield from serve_app(argv=("app.py", "--dry"), timeout=300)


def _tab(pg, name: str):
    return pg.locator("#controls-col [role=tab]", has_text=name).first


def test_a_late_answer_of_a_tab_left_at_once_draws_nothing(app_url, browser):
    pg = browser.new_page(viewport={"width": 1280, "height": 720})
    traffic = QueueTraffic(pg)
    try:
        pg.goto(app_url + "?lesson=07_fragmentation&step=2")
        pg.wait_for_function(f"() => ({STATUS})().includes('lesson page 2')", timeout=120_000)
        pg.wait_for_function(IDLE, timeout=120_000)
        _tab(pg, "Playground").click()
        pg.wait_for_function(f"() => ({STATUS})().includes('operation') && ({TOOLS_SHOWN})()",
                             timeout=120_000)
        pg.wait_for_function(IDLE, timeout=120_000)
        lessons_ids, held = pg.evaluate(ON_LESSONS), []
        assert lessons_ids, "no on_lessons event in the page's config: this test no longer tests it"

        def joins(route) -> None:
            fn = json.loads(route.request.post_data or "{}").get("fn_index")
            (held.append if fn in lessons_ids and not held else lambda r: r.continue_())(route)
        pg.route("**/gradio_api/queue/join*", joins)
        _tab(pg, "Lessons").click()
        pg.wait_for_function("() => document.body.classList.contains('pl-lesson')")
        _tab(pg, "Playground").click()
        pg.wait_for_function(f"() => !document.body.classList.contains('pl-lesson') && ({TOOLS_SHOWN})()")
        # the Lessons click's request, caught on its way
        wait_until(pg, lambda: bool(held), "the Lessons tab sent its on_lessons request", seconds=60)
        mark = len(traffic.log)
        held[0].continue_()  # its answer now comes after the Playground's
        # both answers in (the Playground's shows no timer, so no timer on screen is not enough:
        # a loaded run read the status before that answer came)
        wait_until(pg, lambda: traffic.answered_since(mark), "both tab answers came",
                   detail=traffic.report, meanwhile=traffic.unstick)
        pg.wait_for_function(IDLE, timeout=120_000)
        status = pg.evaluate(STATUS)
        assert "operation" in status and "lesson page" not in status, status
        assert pg.evaluate(TOOLS_SHOWN)
    finally:
        page_log = app_url.log()[-2000:]
        pg.close()
        if "Traceback" in page_log:
            raise AssertionError(page_log)
