"""The page in the room, in a real browser: what a newcomer sees first, and presenter mode on a
projector (1280 x 720 and 1920 x 1080) while a teacher plays lesson 3 with a clicker's keys.

Every wait is on a condition that is false (never an error) while the page is still rendering.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tests.helpers import BUSY, drawn, open_inspector, server_errors
from tests.ui.test_browser import IDLE, LABELS_CUT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")]

PROGRESS = "() => document.querySelector('#lesson-progress')?.innerText ?? ''"
# every box that must be whole on a projector: the mode tabs and the presenter-mode checkbox
NARRATION_BOTTOM = """() => { const p = document.querySelector('#lesson-narration p');
  return p ? p.getBoundingClientRect().bottom : null; }"""
PICTURE = """() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');
  if (!gd?._fullLayout) return null;
  const r = gd.getBoundingClientRect(); return {top: r.top, width: r.width}; }"""


def lesson_page(browser, url: str, width: int, height: int, name: str = "03_fork_cow"):
    pg = browser.new_page(viewport={"width": width, "height": height})
    pg.goto(url + f"?lesson={name}")
    pg.wait_for_function(f"() => ({PROGRESS})().includes('of')", timeout=180_000)
    pg.click("#presenter")
    pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")
    return pg


# what the page says beside the lesson: its status line, any message box, whether Next shows
SAYS = """() => ({status: document.querySelector('#status')?.innerText ?? null,
  boxes: [...document.querySelectorAll('.toast-item')].map((t) => t.innerText.replace(/\\s+/g, ' ')),
  next_shown: document.querySelector('#lesson-next')?.offsetParent != null,
  question: document.querySelector('#lesson-question')?.innerText?.slice(0, 160) ?? null})"""


def press_next(pg, key: str = "ArrowRight", url: str = "") -> None:
    pg.wait_for_function(IDLE, timeout=180_000)  # nothing under way: one key, one page
    before = pg.evaluate(PROGRESS)
    pg.keyboard.press(key)
    # the next page, done: not Gradio's "0.0s" or "processing | 1.3s", shown in the same element
    # meanwhile (a wait that took "0.0s / page 4 of 5" for a new page pressed again too early)
    try:
        pg.wait_for_function(f"(b) => {{ const t = ({PROGRESS})(); return /page \\d+ of/.test(t) && "
                             f"t !== b && ({IDLE})(); }}", arg=before, timeout=180_000)
    except Exception:
        raise AssertionError(f"{key} did not turn the page: {before!r} -> {pg.evaluate(PROGRESS)!r}, "
                             f"focus on {pg.evaluate('document.activeElement?.outerHTML.slice(0, 200)')}; "
                             f"the page says {pg.evaluate(SAYS)!r}; under way: {pg.evaluate(BUSY)}"
                             f"{server_errors(url)}") from None


def test_the_landing_page_says_what_this_is_and_starts_lesson_1(browser, served_app):
    pg = browser.new_page(viewport={"width": 1440, "height": 900})
    pg.goto(served_app)
    pg.wait_for_selector("#landing-start", timeout=180_000)
    assert "KV cache" in pg.locator("#landing").inner_text()
    pg.wait_for_function("() => /SmolLM2-135M-Instruct/.test("
                         "document.querySelector('#status')?.innerText ?? '')", timeout=180_000)
    pg.click("#landing-start")
    pg.wait_for_function(f"() => ({PROGRESS})().startsWith('1.')", timeout=180_000)
    pg.close()


def test_a_projector_shows_the_lesson_whole_and_a_clicker_drives_it(browser, served_app):
    pg = lesson_page(browser, served_app, 1280, 720)
    for _ in range(4):  # the presenter checkbox keeps the focus: the clicker's key still works
        press_next(pg, url=served_app)
    assert drawn(pg, NARRATION_BOTTOM) <= 720  # the sentence about the step, without scrolling
    assert pg.evaluate(LABELS_CUT) == []
    small = drawn(pg, PICTURE)
    assert small["top"] < 720 / 4
    press_next(pg, "ArrowLeft", served_app)  # Back
    pg.close()
    big = lesson_page(browser, served_app, 1920, 1080)
    assert drawn(big, PICTURE)["width"] > 1.3 * small["width"]  # the picture grows with the screen
    assert big.evaluate(LABELS_CUT) == []
    big.close()


# each mode tab: its words whole and its middle answering clicks (not under the top bar)
TABS_REACHABLE = """() => [...document.querySelectorAll('#controls-col [role=tab]')]
  .filter((t) => t.offsetParent && !t.closest('.visually-hidden')).map((t) => {
    const r = t.getBoundingClientRect();
    const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
    return {tab: t.innerText, reachable: t === hit || t.contains(hit)}; })"""


@pytest.mark.parametrize("width, height", [(1024, 768), (1280, 720)])
def test_presenter_mode_on_an_old_projector_keeps_every_tab_whole_and_clickable(browser, served_app,
                                                                                width, height):
    """At 1024 x 768 the six tabs do not fit one row of the column: they take two, growing down
    (they read "Playgrour", "Servinc", and a first wrap went up under the top bar, which took
    the first row's clicks)."""
    pg = browser.new_page(viewport={"width": width, "height": height})
    pg.goto(served_app)
    pg.wait_for_function(IDLE + " && document.querySelector('#presenter') !== null", timeout=180_000)
    pg.click("#presenter")
    pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")
    tabs = pg.evaluate(TABS_REACHABLE)
    assert [t["tab"] for t in tabs] == ["Playground", "Serving", "Lessons", "Compare", "vLLM", "Settings"]
    assert all(t["reachable"] for t in tabs), tabs
    assert pg.evaluate(LABELS_CUT) == []
    pg.get_by_role("tab", name="Serving").click()  # a click of the first row reaches its tab
    pg.wait_for_function("() => document.querySelector('#controls-col [role=tab][aria-selected=true]')"
                         "?.innerText === 'Serving'")
    pg.close()


LIST_OPEN = "() => document.querySelector('#lesson-input-0 input')?.getAttribute('aria-expanded') === 'true'"


def test_a_clicker_turns_the_page_from_a_pages_open_dropdown(browser, served_app):
    """Lesson 1's page 3 asks for a model in a dropdown. A teacher who clicked into its box (its
    list open, the focus in it) and then presses the clicker's Page Down, or its arrow, gets
    the next page, with the list closed (the box serves page 4's input: an open list would
    cover its text) and the focus out of the box for the next press."""
    pg = lesson_page(browser, served_app, 1280, 720, "01_kv_cache")
    for _ in range(3):
        press_next(pg, url=served_app)
    assert "page 3 of" in pg.evaluate(PROGRESS)
    pg.locator("#lesson-input-0 input").click()
    pg.wait_for_function(LIST_OPEN)
    assert pg.evaluate("document.activeElement?.closest('#lesson-input-0') !== null")
    press_next(pg, "PageDown", served_app)
    assert "page 4 of" in pg.evaluate(PROGRESS)
    assert pg.evaluate("!document.activeElement?.closest('#lesson-input-0')")
    assert pg.evaluate(LIST_OPEN) is False
    press_next(pg, "ArrowLeft", served_app)
    assert "page 3 of" in pg.evaluate(PROGRESS)
    pg.locator("#lesson-input-0 input").click()  # the list open again: a clicker's arrow
    pg.wait_for_function(LIST_OPEN)
    press_next(pg, "ArrowRight", served_app)
    assert "page 4 of" in pg.evaluate(PROGRESS)
    assert pg.evaluate(LIST_OPEN) is False
    pg.close()


# the ids of the events the first lesson input starts (any of its events), and of those chained after
EVENTS_OF_BOX = """() => { const cfg = window.gradio_config;
  const box = cfg?.components?.find((c) => c.props?.elem_id === 'lesson-input-0');
  if (!box) return null;
  const own = cfg.dependencies.filter((d) => d.targets.some(([id]) => id === box.id)).map((d) => d.id);
  return {own, after: cfg.dependencies.filter((d) => own.includes(d.trigger_after)).map((d) => d.id)}; }"""
BOX = "() => document.querySelector('#lesson-input-0 input')?.value ?? ''"
NARRATION = "() => document.querySelector('#lesson-narration')?.innerText ?? ''"


class HeldBox:
    """Holds the lesson box's next event in the browser until `let_go`: the order a loaded
    server can give it against a page turn sent after it."""

    def __init__(self, pg) -> None:
        self.pg, self.ids, self.sent, self.held, self.holding = pg, pg.evaluate(EVENTS_OF_BOX), [], [], False
        pg.route("**/gradio_api/queue/join*", self._join)

    def _join(self, route) -> None:
        fn = json.loads(route.request.post_data or "{}").get("fn_index")
        self.sent.append(fn)
        if self.holding and fn in self.ids["own"]:
            self.holding = False
            self.held.append(route)
        else:
            route.continue_()

    def let_go(self) -> None:
        """Send what was held and wait for its answer: what follows it sent (it succeeded), or
        a message box. Nothing held (the box sent nothing): nothing to wait for."""
        self.sent.clear()
        self.holding = False
        for route in self.held:
            route.continue_()

        def answered() -> bool:
            return any(fn in self.ids["after"] for fn in self.sent) or bool(self.pg.evaluate(SAYS)["boxes"])
        deadline = time.monotonic() + 120
        while self.held and not answered() and time.monotonic() < deadline:
            self.pg.wait_for_timeout(100)
        assert not self.held or answered(), f"the box's event was never answered (sent {self.sent})"
        self.held.clear()
        self.pg.wait_for_function(IDLE, timeout=180_000)


def _pick(pg, value: str) -> None:
    pg.locator("#lesson-input-0 input").click()
    pg.get_by_role("option", name=value, exact=True).click()


def test_a_page_turn_beside_the_lesson_box_keeps_the_page_and_the_pick(browser, served_app):
    """Gradio's dropdown sends an event at every blur, and a clicker's arrow from page 3's open
    model picker blurs the box as it presses Next; a quick pick and Next race too. Here the box's
    event reaches the server only after Next's page is on screen (the order a loaded server can
    give them): the page stays, with no message, and a pick made on page 3 holds on page 4."""
    pg = browser.new_page(viewport={"width": 1280, "height": 720})
    pg.goto(served_app + "?lesson=01_kv_cache&step=3")
    pg.wait_for_function(f"() => ({PROGRESS})().includes('page 3 of')", timeout=180_000)
    pg.wait_for_function(f"() => ({BOX})() === 'LLaMA-13B'", timeout=120_000)  # page 3's value
    box = HeldBox(pg)
    box.holding = True
    pg.locator("#lesson-input-0 input").click()  # the list open: the clicker's arrow blurs it
    pg.wait_for_function(LIST_OPEN)
    press_next(pg, "ArrowRight", served_app)
    box.let_go()
    says = pg.evaluate(SAYS)
    assert "page 4 of" in pg.evaluate(PROGRESS) and says["boxes"] == [], says
    pg.wait_for_function(f"() => ({BOX})() === '48'", timeout=120_000)  # page 4's own input
    before = pg.evaluate(NARRATION)
    _pick(pg, "96")  # a pick plays the lesson again with it
    pg.wait_for_function(f"(b) => {{ const t = ({NARRATION})(); return !!t && t !== b; }}", arg=before,
                         timeout=180_000)
    pg.wait_for_function(IDLE, timeout=180_000)
    assert "page 4 of" in pg.evaluate(PROGRESS) and pg.evaluate(BOX) == "96"
    press_next(pg, "ArrowLeft", served_app)
    pg.wait_for_function(f"() => ({BOX})() === 'LLaMA-13B'", timeout=120_000)
    box.holding = True
    _pick(pg, "LLaMA-7B")  # picked on page 3, handled after the clicker's Next
    pg.keyboard.press("ArrowRight")  # the held pick is still under way: no wait for quiet here
    pg.wait_for_function(f"() => ({PROGRESS})().includes('page 4 of')", timeout=180_000)
    box.let_go()
    says = pg.evaluate(SAYS)
    assert "page 4 of" in pg.evaluate(PROGRESS) and says["boxes"] == [], says
    assert pg.evaluate(BOX) == "96"
    press_next(pg, "ArrowLeft", served_app)
    pg.wait_for_function(f"() => ({BOX})() === 'LLaMA-7B'", timeout=120_000)
    pg.close()


def test_the_inspector_works_on_a_lessons_picture(browser, served_app):
    """Lesson 3 asks the student to click the copied blocks: in the Lessons tab a click on a
    block opens the inspector with that block of the lesson's engine."""

    pg = browser.new_page(viewport={"width": 1440, "height": 900})
    pg.goto(served_app + "?lesson=03_fork_cow&step=4")
    pg.wait_for_function(f"() => ({PROGRESS})().includes('4 of')", timeout=180_000)
    pg.wait_for_function("() => document.querySelector('#lesson-narration')?.innerText"
                         ".includes('inspector')", timeout=60_000)
    pg.wait_for_function(IDLE, timeout=180_000)  # the lesson's picture is drawn and bound
    open_inspector(pg, 1)
    pg.close()
