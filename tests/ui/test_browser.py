"""The app in a real browser (Debian's Chromium driven by Playwright).

Dry app (fast): the layout at 1440 x 900 and on a 390 x 844 phone (the picture starts in the
upper half and is >= 60% of the window wide; the controls sit beside it or under it).
Real default model: New sequence puts the prompt's tokens in their slots (trace text, not
hover); clicking a block opens its real K/V, clicking a table row selects the sequence; Fork then
Append shows the copy-on-write without scrolling; Back restores; a lesson played to its end
drives the main picture and the events panel; Play / Pause; no console errors.
Screenshots go to /tmp, or to docs/ (the README shows them) with PAGEDLAB_UPDATE_SCREENSHOTS=1."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.helpers import box_of
from ui.app_process import ROOT, free_port, launch, stop

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="Debian's chromium is not installed (scripts/setup.sh installs it)")]
# the README's screenshots are refreshed only on request, so a test run leaves the tree clean
SHOTS = os.path.join(ROOT, "docs") if os.environ.get("PAGEDLAB_UPDATE_SCREENSHOTS") else "/tmp"
WIDE, PHONE = {"width": 1440, "height": 900}, {"width": 390, "height": 844}

# the page position of a picture cell: the pool cell whose customdata[0] is a block id, or the
# block-table cell of a sequence id
# null until the picture is drawn and holds the cell (never throws while the page renders)
CELL_XY = """([name, want]) => {
  const gd = document.querySelector('#pool-plot .js-plotly-plot');
  const t = gd?.data?.find((d) => d.name === name);
  const drag = gd?.querySelector('.nsewdrag');
  if (!t?.customdata || !drag || !gd._fullLayout?.xaxis || !gd._fullLayout.yaxis) return null;
  const area = drag.getBoundingClientRect();
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  for (let r = 0; r < t.z.length; r++) for (let c = 0; c < t.z[r].length; c++) {
    const cd = t.customdata[r]?.[c];
    if (cd && cd[0] === want) {
      return [area.left + xa.l2p((t.x[c] + t.x[c + 1]) / 2), area.top + ya.l2p(t.y[r])];
    }
  }
  return null;
}"""
PICTURE = "() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');" \
          " const pool = gd?.data?.find((t) => t.name === 'pool'); return pool && gd.layout ? " \
          "{title: gd.layout.title?.text, names: gd.data.map((t) => t.name), pool: pool.text} : null; }"
# no Gradio event under way: its status ("0.0s", "processing | 1.3s") sits inside the outputs'
# elements meanwhile, so a wait for a changed text must also wait for this
IDLE = "() => ![...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null)"
# the labels shown cut: the controls' tabs and row buttons and the presenter box, each whose
# words reach past its own box or the window (Gradio's hidden copy of the tab row aside), and the
# chosen value of a dropdown (a lesson's title) wider than its box
LABELS_CUT = """() => [...document.querySelectorAll(
    '#controls-col [role=tab], #controls-col .row > button, #presenter label')]
  .filter((b) => b.offsetParent && !b.closest('.visually-hidden')).filter((b) => {
    const box = b.getBoundingClientRect(), range = document.createRange();
    range.selectNodeContents(b);
    const text = range.getBoundingClientRect();  // the words themselves, wherever they overflow
    return text.right > Math.min(box.right, innerWidth) + 0.5 || text.left < Math.max(box.left, 0) - 0.5;
  }).map((b) => b.innerText).concat([...document.querySelectorAll('#controls-col input[role=combobox]')]
    .filter((i) => i.offsetParent && i.scrollWidth > i.clientWidth + 1).map((i) => i.value))"""
# every motion the page started has played to its end (endless ones, such as a spinner, aside)
MOTION_DONE = ("() => document.getAnimations().every((a) => a.playState === 'finished'"
               " || a.effect?.getComputedTiming().iterations === Infinity)")


def open_page(browser, url: str, viewport: dict):
    pg = browser.new_page(viewport=viewport)
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.goto(url)
    pg.wait_for_selector("#new-seq", timeout=120_000)  # generous: a busy 2-core machine
    pg.wait_for_function(PICTURE, timeout=120_000)
    pg.console_errors = errors
    return pg


@pytest.fixture(scope="module")
def dry_app():
    port = free_port()
    proc = launch(["app.py", "--dry"], port)
    yield f"http://127.0.0.1:{port}/"
    stop(proc)


@pytest.fixture(scope="module")
def page(browser, served_app):
    pg = open_page(browser, served_app, WIDE)
    yield pg
    pg.close()


def events_text(pg) -> str:
    return pg.locator("#event-log").inner_text()


def click_cell(pg, at: list) -> None:
    """Click the picture's cell `at` ([trace name, physical id]) once it is drawn: the event log
    can show an operation before the picture does (CELL_XY reads null until then)."""
    pg.mouse.click(*pg.wait_for_function(CELL_XY, arg=at, timeout=60_000).json_value())


def click_and_wait(pg, selector: str, until: str, timeout: int = 60_000) -> None:
    pg.click(selector)
    pg.wait_for_function("(t) => document.querySelector('#event-log')?.innerText.includes(t)", arg=until,
                         timeout=timeout)


# the type of the picture's head line (its title's first span; the title's own type is the key's)
HEAD_PX = ("(() => +(/^<span style='font-size:(\\d+)px'>/.exec(document.querySelector("
           "'#pool-plot .js-plotly-plot')?.layout?.title?.text ?? '') ?? [0, 0])[1])()")


def picture_box(pg) -> dict:
    return box_of(pg, "#pool-plot .js-plotly-plot")


def every_label_whole(pg) -> None:
    """Each tab in turn, its widest button shown: no tab's or button's label cut (a second row of
    tabs where six do not fit), nor a dropdown's chosen value, and a click on a tab reaches it.
    Lessons off a slide only: in presenter mode a lesson is a slide of its own
    (tests/ui/test_presenter_browser.py), its tabs out of the way."""
    slide = pg.evaluate("document.body.classList.contains('pl-presenter')")
    lessons = () if slide else (("Lessons", "Start"),)
    for tab, widest in (("Serving", "Run to the end"), ("Settings", "Apply (new session)"),
                        *lessons, ("Playground", "New sequence")):
        pg.get_by_role("tab", name=tab).click(timeout=30_000)
        pg.get_by_role("button", name=widest, exact=True).wait_for(state="visible")
        assert pg.evaluate(LABELS_CUT) == [], tab


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1440x900", "390x844"])
def test_the_picture_is_the_page(browser, dry_app, viewport):
    pg = open_page(browser, dry_app, viewport)
    try:
        box = picture_box(pg)  # as the page opens
        assert box["y"] < viewport["height"] / 2  # starts in the upper half of the first screen
        assert box["width"] >= 0.6 * viewport["width"]
        assert box["x"] + box["width"] <= viewport["width"] + 1  # no sideways scrolling
        assert pg.evaluate("document.documentElement.scrollWidth") <= viewport["width"] + 1
        every_label_whole(pg)
        click_and_wait(pg, "#new-seq", "prefill")
        if viewport is WIDE:  # the playground's controls sit beside the picture, on screen
            assert pg.evaluate("window.scrollY") == 0  # the click did not scroll the page
            for sel in ("#new-seq", "#append", "#fork", "#free"):
                b = pg.locator(sel).bounding_box()
                assert b["x"] >= box["x"] + box["width"] - 1 and b["y"] + b["height"] <= viewport["height"]
            pg.click("#presenter")  # presenter mode: large type on the page and in the picture
            pg.wait_for_function(HEAD_PX + " > 20", timeout=30_000)
            assert pg.evaluate("document.body.classList.contains('pl-presenter')")
            every_label_whole(pg)  # the tabs on one row there, each one's click its own
            pg.click("#presenter")
        else:  # on a phone the controls follow the picture; the picture shows the new sequence
            pg.evaluate("window.scrollTo(0, 0)")
            assert "seq 0" in pg.locator("#pool-plot").inner_text()
        pg.screenshot(path=os.path.join(SHOTS, f"layout-{viewport['width']}.png"))
        assert pg.console_errors == []
    finally:
        pg.close()


# whether each of the session's own panels is on the page (null while the page renders)
SESSION_PANELS = """() => { const on = ['#event-log', '#view-choice', '#inspector', '#sequences',
  '#metrics'].map((s) => document.querySelector(s)); return on.every((e) => e)
  ? on.map((e) => e.offsetParent !== null) : null; }"""


def test_the_vllm_tab_shows_vllm_and_not_the_sessions_panels(browser, dry_app):
    """The vLLM tab draws vLLM's cache in the picture's place: the session's events, view choice,
    inspector, sequences and counts describe another engine and are not beside it; back on
    Playground they are again."""
    pg = open_page(browser, dry_app, WIDE)
    try:
        click_and_wait(pg, "#new-seq", "prefill")
        assert pg.evaluate(SESSION_PANELS) == [True] * 5
        pg.get_by_role("tab", name="vLLM").click()
        # the panels go at once (the page's class); vLLM's picture comes with the tab's answer
        pg.wait_for_function(f"() => ({SESSION_PANELS})()?.every((shown) => !shown) && "
                             "document.querySelector('#vllm-tree')?.offsetParent != null", timeout=60_000)
        pg.get_by_role("tab", name="Playground").click()
        pg.wait_for_function(f"() => ({SESSION_PANELS})()?.every((shown) => shown)", timeout=30_000)
        assert pg.console_errors == []
    finally:
        pg.close()


def test_the_inspector_follows_its_block_after_free(browser, dry_app):
    """Issue 23: after Free the inspector no longer describes the block as its old owner's: the
    picture's change rewrites the note (dry app: the block's bookkeeping, no K/V)."""
    pg = open_page(browser, dry_app, WIDE)
    note = "() => { const n = document.querySelector('#inspector-note'); return n ? n.innerText : ''; }"
    try:
        click_and_wait(pg, "#new-seq", "prefill")
        click_cell(pg, ["pool", 0])
        pg.wait_for_function(f"() => ({note})().includes('Block 0: used, ref count 1, held by seq 0')",
                             timeout=60_000)
        click_and_wait(pg, "#free", "seq 0 freed")
        pg.wait_for_function(f"() => /Block 0: (cached|free): no sequence holds it/.test(({note})())",
                             timeout=60_000)
        assert "held by seq 0" not in pg.evaluate(note)
        assert pg.console_errors == []
    finally:
        pg.close()


def test_new_sequence_puts_the_prompts_tokens_in_their_slots(page, default_model):
    click_and_wait(page, "#new-seq", "prefill")
    pool = page.evaluate(PICTURE)["pool"]
    ids = default_model.tokenizer.encode("Four score and seven years ago")
    tokens = [default_model.tokenizer.decode([t]).strip() for t in ids]
    shown = [t for t in pool[0] if t and not t[0].isdigit() and not t.startswith("▸")][: len(tokens)]
    assert len(shown) == len(tokens)
    for text, token in zip(shown, tokens, strict=True):  # truncated to fit, never another token
        assert token.startswith(text.rstrip("…")), (text, token)
    drawn = page.locator("#pool-plot").inner_text().split("\n")  # drawn, not only in the data
    assert all(text in drawn for text in shown)


def test_clicking_a_block_opens_its_kv_and_a_row_selects_the_sequence(page):
    click_and_wait(page, "#fork", "forked into seq 1")
    click_cell(page, ["pool", 0])
    page.wait_for_function("() => { const n = document.querySelector('#inspector-note');"
                           " return n && n.innerText.includes('Block 0'); }", timeout=60_000)
    page.wait_for_selector("#kv-plot .main-svg", timeout=60_000)  # the real K/V heatmaps
    assert "ref count 2" in page.locator("#inspector-note").inner_text()
    assert "selected" in page.evaluate(PICTURE)["names"]
    click_cell(page, ["block tables", 0])
    page.wait_for_function("() => document.querySelector('#seq-choice input')?.value === '0'",
                           timeout=60_000)
    click_cell(page, ["block tables", 1])
    page.wait_for_function("() => document.querySelector('#seq-choice input')?.value === '1'",
                           timeout=60_000)
    assert page.console_errors == []


COUNT_MOTION = """() => { window.plMotions = 0; const animate = Element.prototype.animate;
  Element.prototype.animate = function (...args) { window.plMotions += 1; return animate.apply(this, args); };
}"""
# the page's script has handled the figure now shown (bound its clicks, played its motion)
HANDLED = "() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');" \
          " return !!(gd && gd.layout && gd.layout.meta) && window.plAnimated === gd.layout.meta.anim; }"


def test_fork_then_append_shows_the_copy_on_write_without_scrolling(page):
    page.evaluate(COUNT_MOTION)
    click_and_wait(page, "#append", "wrote")  # seq 1 (selected by the click) writes its tail
    assert "copy-on-write" in events_text(page)
    page.wait_for_function("() => !!document.querySelector('#pool-plot .js-plotly-plot')?.data"
                           ".find((t) => t.name === 'copy-on-write')", timeout=60_000)
    assert page.evaluate("window.scrollY") == 0
    arrow = page.evaluate("""() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');
        const k = gd.data.filter((t) => (t.type || 'scatter') === 'scatter')
                    .findIndex((t) => t.name === 'copy-on-write');
        const r = gd.querySelectorAll('.scatterlayer > .trace')[k].getBoundingClientRect();
        return [r.top, r.bottom, r.width]; }""")
    assert 0 <= arrow[0] and arrow[1] <= WIDE["height"] and arrow[2] > 0  # on the first screen
    page.wait_for_function(HANDLED, timeout=10_000)
    assert page.evaluate("window.plMotions") > 0  # the copy's arrow drew itself, the block faded in
    page.wait_for_function(MOTION_DONE, timeout=10_000)  # the screenshot shows the end state
    os.makedirs(SHOTS, exist_ok=True)
    page.screenshot(path=os.path.join(SHOTS, "playground-cow.png"), full_page=False)
    page.click("#reduce-motion")
    page.wait_for_function("() => document.body.classList.contains('pl-reduce-motion')", timeout=10_000)
    page.evaluate("window.plMotions = 0")
    page.click("#tl-back")
    page.wait_for_function("() => !document.querySelector('#event-log')?.innerText.includes('copy-on-write')",
                           timeout=60_000)
    assert "copy-on-write" not in page.evaluate(PICTURE)["names"]
    page.wait_for_function(HANDLED, timeout=10_000)
    assert page.evaluate("window.plMotions") == 0  # reduce motion: the change is drawn, not moved
    page.click("#reduce-motion")
    assert page.console_errors == []


def test_a_lesson_played_to_its_end_drives_the_main_picture_and_events(page):
    page.get_by_role("tab", name="Lessons").click()
    page.click("#lesson-start")
    page.wait_for_function("() => document.querySelector('#lesson-narration')?.innerText.length > 20",
                           timeout=60_000)
    seen = set()
    for i in range(40):
        text = page.locator("#lesson-narration").inner_text()
        seen.add(text)
        if "the end" in page.locator("#lesson-progress").inner_text():
            break
        page.click("#lesson-next")
        page.wait_for_function(
            f"(old) => document.querySelector('#lesson-narration')?.innerText !== old && ({IDLE})()",
            arg=text, timeout=60_000)
        if i == 0:  # step 1 adds a sequence: its prefill is narrated beside the lesson (the event
            # log may be drawn a moment after the narration: wait, do not read once)
            page.wait_for_function(
                "() => !!document.querySelector('#event-log')?.innerText.includes('prefill')",
                timeout=60_000)
    assert "the end" in page.locator("#lesson-progress").inner_text()
    assert len(seen) >= 3  # the narration changed at every step
    assert len(page.locator(".js-plotly-plot").all()) >= 1
    # lesson 1's pool (32 blocks of 16) is on the one main picture, its events beside it
    page.wait_for_function("() => document.querySelector('#pool-plot .js-plotly-plot')?.layout?.title?.text"
                           "?.includes('32 blocks')", timeout=60_000)
    assert "No events yet" not in events_text(page)
    assert not page.locator("#lesson-plot").count()  # no second plot
    page.screenshot(path=os.path.join(SHOTS, "lesson.png"), full_page=False)
    page.get_by_role("tab", name="Playground").click()  # back to the playground's own engine
    page.wait_for_function("() => document.querySelector('#pool-plot .js-plotly-plot')?.layout?.title?.text"
                           "?.includes('64 blocks')", timeout=60_000)
    assert page.console_errors == []


def test_a_link_opens_a_lesson_step(page, served_app):
    page.goto(served_app + "?lesson=02_paging&step=2")
    page.wait_for_function("() => document.body.innerText.includes('page 2 of')", timeout=60_000)
    page.console_errors.clear()  # leaving the old page aborts its pending fetches: not this page's
    assert "2. Paging" in page.locator("#lesson-progress").inner_text()
    page.wait_for_function("() => document.querySelector('#pool-plot .js-plotly-plot')?.layout?.title?.text"
                           "?.includes('16 blocks')", timeout=60_000)  # lesson 2's pool
    assert page.console_errors == []


def test_play_replays_the_log_and_pause_stops_it(browser, dry_app):
    page = open_page(browser, dry_app, WIDE)  # the log's replay, not the model, is under test
    for selector, text in (("#new-seq", "prefill"), ("#fork", "forked"), ("#fork", "seq 2"),
                           ("#fork", "seq 3")):
        click_and_wait(page, selector, text)
    for _ in range(3):  # one Back at a time: a click on a busy button is dropped, not queued
        before = events_text(page)
        page.click("#tl-back")
        page.wait_for_function(f"(old) => document.querySelector('#event-log')?.innerText !== old "
                               f"&& ({IDLE})()", arg=before, timeout=60_000)
    assert "forked" not in events_text(page)
    page.click("#tl-play")
    page.wait_for_function("() => document.querySelector('#event-log')?.innerText.includes('forked')",
                           timeout=60_000)
    page.click("#tl-pause")
    # a tick already on its way when Pause was clicked may still land (on a loaded machine,
    # later than a fixed wait): wait until the log holds still, then that it stays still
    paused_at, still_since, deadline = events_text(page), time.monotonic(), time.monotonic() + 60
    while time.monotonic() - still_since < 1.5:
        assert time.monotonic() < deadline, "the timeline kept moving after Pause"
        page.wait_for_timeout(100)
        now = events_text(page)
        if now != paused_at:
            paused_at, still_since = now, time.monotonic()
    page.wait_for_timeout(3000)  # a playing timer would have moved on by now
    assert events_text(page) == paused_at
    assert page.console_errors == []
    page.close()
