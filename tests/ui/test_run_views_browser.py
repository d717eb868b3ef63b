"""The views of the run in a real browser (Debian's Chromium), on the dry app: a workload run to
the end; the request timeline follows Back and Next; a click on a timeline cell goes to that
step and selects its request (its blocks outlined in the picture), a click on a group's lane
opens it into its sequences; a click on a prefix-tree cell selects that block in the picture;
in presenter mode at 1280 x 720 the picture and its view share the slide, on a 390 px phone
they stack. Screenshots of each view go to /tmp (docs/ with PAGEDLAB_UPDATE_SCREENSHOTS=1)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import BUSY, box_of, open_inspector
from ui.app_process import ROOT, free_port, launch, stop

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="Debian's chromium is not installed (scripts/setup.sh installs it)")]
SHOTS = os.path.join(ROOT, "docs") if os.environ.get("PAGEDLAB_UPDATE_SCREENSHOTS") else "/tmp"
IDLE = "() => ![...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null)"
# the view under the picture, once drawn: its meta (null while the page renders: never throws)
META = "() => document.querySelector('#view-plot .js-plotly-plot')?.layout?.meta ?? null"
STATUS = "() => document.querySelector('#status')?.innerText ?? ''"
# the page position of a trace's point: a heatmap cell (x, y) or a text trace's point
POINT_XY = """([name, x, y]) => {
  const gd = document.querySelector('#view-plot .js-plotly-plot');
  const drag = gd?.querySelector('.nsewdrag');
  const t = gd?._fullData?.find((d) => d.name === name);
  const xa = gd?._fullLayout?.[(t?.xaxis || 'x').replace('x', 'xaxis')];
  const ya = gd?._fullLayout?.[(t?.yaxis || 'y').replace('y', 'yaxis')];
  if (!t || !drag || !xa || !ya) return null;
  const area = gd.getBoundingClientRect();
  return [area.left + xa._offset + xa.l2p(x), area.top + ya._offset + ya.l2p(y)];
}"""
PICTURE_TRACES = ("() => (document.querySelector('#pool-plot .js-plotly-plot')?._fullData ?? [])"
                  ".map((t) => t.name)")


@pytest.fixture(scope="module")
def dry_app():
    port = free_port()
    proc = launch(["app.py", "--dry"], port)
    yield f"http://127.0.0.1:{port}/"
    stop(proc)


def wait_meta(pg, condition: str, timeout: int = 60_000) -> dict:
    """Wait until the view's meta `m` satisfies `condition` (a JS expression over m)."""
    pg.wait_for_function(f"() => {{ const m = ({META})(); return !!m && ({condition}); }}",
                         timeout=timeout)
    pg.wait_for_function(IDLE, timeout=timeout)
    return pg.evaluate(META)


def choose(pg, view: str, condition: str) -> dict:
    pg.locator("#view-choice").get_by_text(view, exact=True).click()
    return wait_meta(pg, condition)


def click_point(pg, name: str, x: float, y: float) -> None:
    pg.locator("#view-plot .js-plotly-plot").scroll_into_view_if_needed()
    xy = pg.evaluate(POINT_XY, [name, x, y])
    assert xy is not None, name
    pg.mouse.click(*xy)


def select_by_click(pg, name: str, x: float, y: float, done: str) -> None:
    """Click a point that selects (clicking it again selects the same) until `done` holds: a
    click that landed while Gradio swapped the view's element for a redraw is lost."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(5):
        click_point(pg, name, x, y)
        try:
            pg.wait_for_function(done, timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == 4:
                raise


def run_workload(pg, name: str) -> None:
    pg.get_by_role("tab", name="Serving").click()
    pg.locator("#workload input").click()
    pg.get_by_role("option", name=name).click()
    # the pick is in the box and its list closed before Load: a loaded clean-clone run once saw
    # Load pressed (it had the focus) with the box showing the name and nothing loaded in 60 s
    _wait(pg, "(n) => document.querySelector('#workload input')?.value === n && "
              "!document.querySelector('#workload [role=listbox], #workload ul.options')", 30_000,
          f"the pick of {name!r} in the box", arg=name)
    pg.locator("#load-workload").click()  # a new session with the workload's requests added
    _wait(pg, f"() => {{ const m = /operation (\\d+) of (\\d+)/.exec(({STATUS})());"
              " return !!m && m[1] === m[2] && +m[2] >= 2; }", 60_000, f"the workload {name!r} loaded")
    _wait(pg, IDLE, 60_000, "quiet after loading it")
    pg.get_by_role("button", name="Run to the end").click()
    _wait(pg, f"() => {{ const m = /operation (\\d+) of (\\d+)/.exec(({STATUS})());"
              " return !!m && m[1] === m[2] && +m[2] > 4; }", 120_000, "run to the end")
    _wait(pg, IDLE, 60_000, "quiet after the run")


def _wait(pg, condition: str, timeout: float, what: str, arg=None) -> None:
    """Wait for `condition`; when it never holds, say what the page showed instead (the status
    line, the workload box, what is under way, any message box)."""
    try:
        pg.wait_for_function(condition, arg=arg, timeout=timeout)
    except Exception:
        box = pg.evaluate("() => document.querySelector('#workload input')?.value ?? null")
        said = pg.evaluate("() => [...document.querySelectorAll('.toast-item')].map((t) => t.innerText)")
        raise AssertionError(f"never {what}: status {pg.evaluate(STATUS)!r}, workload box {box!r}, "
                             f"under way: {pg.evaluate(BUSY)}, message boxes {said}") from None


def test_the_views_follow_the_run_and_select_what_is_clicked(browser, dry_app):
    pg = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        pg.goto(dry_app)
        pg.wait_for_selector("#pool-plot .js-plotly-plot", timeout=120_000)
        run_workload(pg, "beams and samples")
        # the workload chose the timeline: the cursor on the last step
        meta = wait_meta(pg, "m.view === 'timeline' && m.cursor === m.columns.length - 1")
        cols = meta["columns"]
        pg.click("#tl-back")  # Back: the cursor on the step before
        wait_meta(pg, f"m.cursor === {len(cols) - 2}")
        pg.click("#tl-next")
        wait_meta(pg, f"m.cursor === {len(cols) - 1}")
        # a cell of the beam request mid-run: that step, that request, its blocks outlined
        row = next(i for i, r in enumerate(meta["rows"]) if r[0] == 0)
        middle = len(cols) // 2
        click_point(pg, "timeline cells", middle, row)
        wait_meta(pg, f"m.cursor === {middle}")
        assert f"operation {cols[middle]} of" in pg.evaluate(STATUS)
        pg.wait_for_function(f"() => ({PICTURE_TRACES})().includes('selected request')")
        # the beam group's lane label opens it into its sequences
        click_point(pg, "lanes", 0.99, row)
        opened = wait_meta(pg, f"m.rows.length > {len(meta['rows'])}")
        assert all(r[0] == 0 for r in opened["rows"][row + 1: row + 3])
        pg.screenshot(path=os.path.join(SHOTS, "timeline-serving.png"))
        # the prefix tree: a cell selects its block in the picture (and the inspector says so)
        tree = choose(pg, "prefix tree", "m.view === 'tree'")
        assert tree["rows"] >= 1
        block = pg.evaluate("""() => { const gd = document.querySelector('#view-plot .js-plotly-plot');
          const t = gd.data.find((d) => d.name === 'prefix tree');
          for (let r = 0; r < t.customdata.length; r++) for (let c = 0; c < t.customdata[r].length; c++)
            if (t.customdata[r][c][0] >= 0) return [c, r, t.customdata[r][c][0]];
          return null; }""")
        assert block is not None
        selected = f"() => ({PICTURE_TRACES})().includes('selected')"
        select_by_click(pg, "prefix tree", block[0], block[1], selected)
        pg.wait_for_function("(b) => document.querySelector('#inspector-note')?.innerText"
                             ".includes(`Block ${b}`)", arg=block[2], timeout=60_000)
        choose(pg, "memory", "m.view === 'memory'")
        assert not [e for e in errors if "favicon" not in e], errors
    finally:
        pg.close()


@pytest.mark.parametrize("size", [(1280, 720), (390, 844)], ids=["presenter", "phone"])
def test_each_view_fits_a_slide_and_a_phone(browser, dry_app, size):
    w, h = size
    pg = browser.new_page(viewport={"width": w, "height": h})
    try:
        pg.goto(dry_app)
        pg.wait_for_selector("#pool-plot .js-plotly-plot", timeout=120_000)
        if w > 600:
            pg.click("#presenter")
            pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")
        if w < 600:  # before any serving step, on a phone (where its lines wrap): the view says
            # why it is empty, under its title, not over it
            choose(pg, "timeline", "m.view === 'note'")
            title, note = (box_of(pg, f"#view-plot {s}") for s in (".gtitle", ".annotation"))
            plot = box_of(pg, "#view-plot .js-plotly-plot")
            assert note["y"] >= title["y"] + title["height"] - 1, (title, note)
            assert note["y"] + note["height"] <= plot["y"] + plot["height"] + 1, (note, plot)
        run_workload(pg, "preemption (a pool too small)")
        for view, key in (("timeline", "timeline"), ("memory", "memory"), ("prefix tree", "tree")):
            choose(pg, view, f"m.view === '{key}'")
            pg.wait_for_function(IDLE)
            plot = box_of(pg, "#view-plot .js-plotly-plot")
            picture = box_of(pg, "#pool-plot .js-plotly-plot")
            assert plot["x"] + plot["width"] <= w + 1 and picture["x"] + picture["width"] <= w + 1
            if w > 600:  # a slide: the picture over its view, both on the screen, nothing scrolls
                assert plot["y"] >= picture["y"] + picture["height"] - 2
                assert plot["y"] + plot["height"] <= h + 1
                assert pg.evaluate("document.documentElement.scrollHeight") <= h + 1
            fonts = pg.evaluate("""() => [...document.querySelectorAll('#view-plot text')]
              .filter((t) => t.textContent.trim()).map((t) => parseFloat(getComputedStyle(t).fontSize))""")
            assert fonts and min(fonts) >= (16 if w > 600 else 11), (view, min(fonts))
            name = f"{key}-{'presenter' if w > 600 else 'phone'}.png"
            pg.screenshot(path=os.path.join(SHOTS, name), full_page=w < 600)
    finally:
        pg.close()


@pytest.mark.parametrize("size", [(1440, 900), (1280, 720)], ids=["laptop", "presenter"])
def test_a_serving_runs_block_opens_the_inspector_on_the_first_screen(browser, dry_app, size):
    """Serving's controls fill the column: a clicked block's inspector opens over them, under
    the tabs, not a screen below where a projected room never sees it."""
    w, h = size
    pg = browser.new_page(viewport={"width": w, "height": h})
    try:
        pg.goto(dry_app)
        pg.wait_for_selector("#pool-plot .js-plotly-plot", timeout=120_000)
        if w < 1440:
            pg.click("#presenter")
            pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")
        run_workload(pg, "a shared prefix (one system prompt)")
        pg.evaluate("window.scrollTo(0, 0)")
        open_inspector(pg, 1, kv=False)  # the dry mode's inspector: the block's words, no K/V
        pg.evaluate("window.scrollTo(0, 0)")
        note, tabs = box_of(pg, "#inspector-note"), box_of(pg, "#controls-col [role=tablist]")
        assert note["y"] + note["height"] < h, note  # on the screen, without scrolling
        assert note["y"] >= tabs["y"] + tabs["height"] - 2  # under the tabs, which stay usable
        pg.screenshot(path=os.path.join(SHOTS, f"serving-inspector-{w}x{h}.png"))
    finally:
        pg.close()
