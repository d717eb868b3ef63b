"""The app in a real browser (Debian's Chromium driven by Playwright), on the real default model:
new sequence -> append -> fork -> append shows a copy-on-write in the figure and the event log;
Back restores the previous picture; a lesson plays to the end with Next; no console errors.
Screenshots go to /tmp, or to docs/ (the README shows them) with PAGEDLAB_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.test_ui import served_app  # noqa: F401  (the launched app fixture)
from ui.app_process import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="Debian's chromium is not installed (scripts/setup.sh installs it)")
# the README's screenshots are refreshed only on request, so a test run leaves the tree clean
SHOTS = os.path.join(ROOT, "docs") if os.environ.get("PAGEDLAB_UPDATE_SCREENSHOTS") else "/tmp"


@pytest.fixture(scope="module")
def page(served_app):  # noqa: F811
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        pg = browser.new_page(viewport={"width": 1500, "height": 1100})
        errors: list[str] = []
        pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        pg.goto(served_app)
        pg.wait_for_selector("#new-seq", timeout=60_000)
        pg.console_errors = errors
        yield pg
        browser.close()


def events_text(pg) -> str:
    return pg.locator("#event-log").inner_text()


def click_and_wait(pg, selector: str, until: str, timeout: int = 60_000) -> None:
    pg.click(selector)
    pg.wait_for_function("(t) => document.querySelector('#event-log').innerText.includes(t)", arg=until,
                         timeout=timeout)


def test_playground_shows_copy_on_write_and_back_restores(page):
    click_and_wait(page, "#new-seq", "prefill")
    click_and_wait(page, "#append", "wrote")
    click_and_wait(page, "#fork", "forked into seq 1")
    page.locator("#pool-plot .main-svg").first.wait_for()
    before_cow = page.locator("#pool-plot").inner_html()
    # the sequence dropdown now holds the child: append to it writes into the shared tail
    click_and_wait(page, "#append", "copy-on-write")
    assert "copy-on-write" in events_text(page)
    page.wait_for_timeout(500)
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, "playground-cow.png"), full_page=False)
    after_cow = page.locator("#pool-plot").inner_html()
    assert after_cow != before_cow
    page.get_by_role("button", name="◀ Back").first.click()
    page.wait_for_function("() => document.querySelector('#event-log').innerText.includes('forked')",
                           timeout=60_000)
    assert "copy-on-write" not in events_text(page)
    assert page.console_errors == []


def test_a_lesson_plays_to_the_end_with_next(page):
    page.get_by_role("tab", name="Lessons").click()
    page.click("#lesson-start")
    page.wait_for_function("() => document.querySelector('#lesson-narration').innerText.length > 20",
                           timeout=60_000)
    seen = set()
    for _ in range(40):
        text = page.locator("#lesson-narration").inner_text()
        seen.add(text)
        if "the end" in page.locator("body").inner_text():
            break
        page.click("#lesson-next")
        page.wait_for_function(
            "(old) => document.querySelector('#lesson-narration').innerText !== old", arg=text,
            timeout=60_000)
    assert "the end" in page.locator("body").inner_text()
    assert len(seen) >= 3  # the narration changed at every step
    page.screenshot(path=os.path.join(SHOTS, "lesson.png"), full_page=False)
    assert page.console_errors == []


def test_a_link_opens_a_lesson_step(page, served_app):  # noqa: F811
    page.goto(served_app + "?lesson=02_paging&step=2")
    page.wait_for_function("() => document.body.innerText.includes('step 2 of')", timeout=60_000)
    page.console_errors.clear()  # leaving the old page aborts its pending fetches: not this page's
    assert "2. Paging" in page.locator("body").inner_text()
    assert page.console_errors == []


def test_play_replays_the_log_and_pause_stops_it(page, served_app):  # noqa: F811
    page.goto(served_app)
    page.wait_for_selector("#new-seq", timeout=60_000)
    page.console_errors.clear()  # leaving the old page aborts its pending fetches: not this page's
    for selector, text in (("#new-seq", "prefill"), ("#fork", "forked"), ("#fork", "seq 2"),
                           ("#fork", "seq 3")):
        click_and_wait(page, selector, text)
    for _ in range(3):  # one Back at a time: a click on a busy button is dropped, not queued
        before = events_text(page)
        page.get_by_role("button", name="◀ Back").first.click()
        page.wait_for_function("(old) => document.querySelector('#event-log').innerText !== old",
                               arg=before, timeout=60_000)
    assert "forked" not in events_text(page)
    page.get_by_role("button", name="Play").first.click()
    page.wait_for_function("() => document.querySelector('#event-log').innerText.includes('forked')",
                           timeout=60_000)
    page.get_by_role("button", name="Pause").first.click()
    page.wait_for_timeout(300)
    paused_at = events_text(page)
    page.wait_for_timeout(3000)  # a playing timer would have moved on by now
    assert events_text(page) == paused_at
    assert page.console_errors == []
