"""Serving on a 390 x 844 phone (issue 42, item 9), in Chromium with touch: the shared-prefix
workload mid-run. Nothing of the picture is cut (a block's id whole in its cell, every line of
text inside the picture), a tap on a sequence's name selects it, the prefix tree tells its
branches apart and a tapped node's tooltip leaves the tree in view; the block inspector's K and
V heatmaps and its title are each clear of the rest. Waits are on conditions that never throw."""

from __future__ import annotations

import os
import shutil

import pytest

from scripts.walkthrough_views import _choose, _workload
from tests.helpers import box_of, drawn
from tests.ui.test_browser import IDLE, LABELS_CUT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")]
PHONE = {"width": 390, "height": 844}
# texts of a plot cut by its own edges or its plot area's: [text, why] (null while it renders)
CUT = """(sel) => {
  const gd = document.querySelector(sel + ' .js-plotly-plot');
  const drag = gd?.querySelector('.nsewdrag');
  if (!gd?._fullLayout || !drag) return null;
  const fig = gd.getBoundingClientRect(), area = drag.getBoundingClientRect(), out = [];
  for (const t of gd.querySelectorAll('.main-svg text')) {
    if (!t.textContent.trim() || t.closest('.hoverlayer')) continue;
    const b = t.getBoundingClientRect();
    if (b.right > Math.min(fig.right, innerWidth) + 1 || b.left < Math.max(fig.left, 0) - 1) {
      out.push([t.textContent, 'past the picture']);
    } else if (t.closest('.scatterlayer') && (b.left < area.left - 1 || b.right > area.right + 1)) {
      out.push([t.textContent, 'clipped by the plot area']);  // a trace's text is clipped there
    }
  }
  return out;
}"""
# the page point of a table row's label (the sequence's name), by sequence id
LABEL_XY = """(sid) => {
  const gd = document.querySelector('#pool-plot .js-plotly-plot');
  const i = (gd?.layout?.annotations ?? []).findIndex((a) => a.name === `seq:${sid}`);
  const el = i < 0 ? null : gd.querySelectorAll('.annotation')[i];
  const b = el?.getBoundingClientRect();
  return b && b.width ? [b.left + b.width / 2, b.top + b.height / 2] : null;
}"""
SELECTED = "() => document.querySelector('#seq-choice input')?.value ?? ''"


def _phone(browser, url: str):
    pg = browser.new_page(viewport=PHONE, is_mobile=True, has_touch=True)
    pg.goto(url)
    pg.wait_for_selector("#pool-plot .js-plotly-plot", timeout=180_000)
    return pg


def _back(pg, times: int) -> None:
    for _ in range(times):
        pg.click("#tl-back")
        pg.wait_for_function(IDLE, timeout=60_000)


POSITION = ("() => +(document.querySelector('#status')?.innerText.match(/operation (\\d+) of/)?.[1]"
            " ?? -1)")


def _goto(pg, position: int) -> None:
    """Move over the log with the timeline slider's box, as a visitor types a position: one
    move, not `position` Backs (a Back costs a phone's page about a second here)."""
    box = pg.get_by_label("number input for timeline (operations)")
    box.fill(str(position))
    box.blur()  # the slider's release: the page goes there
    pg.wait_for_function(f"(p) => ({POSITION})() === p && ({IDLE})()", arg=position, timeout=60_000)


def test_serving_on_a_phone_cuts_nothing_and_a_name_selects(browser, served_app):
    pg = _phone(browser, served_app)
    try:
        _workload(pg, "a shared prefix (one system prompt)")
        assert pg.evaluate(LABELS_CUT) == []  # the workload's name whole in its picker
        _back(pg, 6)  # mid-run: the system prompt's block shared by every request (×4)
        assert drawn(pg, CUT, "#pool-plot") == []
        assert pg.evaluate("document.documentElement.scrollWidth") <= PHONE["width"] + 1
        # a tap on a sequence's name selects it, as a tap on its table row does
        pg.locator("#pool-plot").scroll_into_view_if_needed()
        pg.mouse.click(*drawn(pg, LABEL_XY, 2))
        pg.wait_for_function(f"() => ({SELECTED})() === '2'", timeout=30_000)
    finally:
        pg.close()


TREE_LABELS = """() => { const gd = document.querySelector('#view-plot .js-plotly-plot');
  const t = gd?.data?.find((d) => d.name === 'prefix tree');
  return t ? t.text.flat().filter((x) => x) : null; }"""
TOOLTIP = """() => { const gd = document.querySelector('#view-plot .js-plotly-plot');
  const tip = gd?.querySelector('.hoverlayer .hovertext'), r = tip?.getBoundingClientRect();
  return r && r.width ? r.width * r.height / (gd.getBoundingClientRect().width *
    gd.getBoundingClientRect().height) : 0; }"""


def test_the_prefix_tree_on_a_phone_tells_branches_apart_and_a_tap_leaves_it_in_view(
        browser, served_app):
    pg = _phone(browser, served_app)
    try:
        _workload(pg, "a shared prefix (one system prompt)")
        _back(pg, 6)
        _choose(pg, "prefix tree", "tree")
        labels = drawn(pg, TREE_LABELS)
        assert len(labels) >= 3 and len(set(labels)) == len(labels), labels  # one per branch
        pg.locator("#view-plot").scroll_into_view_if_needed()
        area = box_of(pg, "#view-plot .js-plotly-plot .nsewdrag")
        pg.mouse.click(area["x"] + area["width"] * 0.75, area["y"] + area["height"] * 0.3)
        pg.wait_for_function(IDLE, timeout=60_000)
        assert pg.evaluate(TOOLTIP) < 0.2  # no tooltip over the tree (a tap selects the block)
    finally:
        pg.close()


# the inspector's K/V figure: its title's box, the modebar's (null: none shown), K's plot area
# and the boxes of the y labels drawn right of it (V's), in page pixels
KV_PARTS = """() => { const gd = document.querySelector('#kv-plot .js-plotly-plot');
  if (!gd?._fullLayout) return null;
  const box = (e) => { const r = e?.getBoundingClientRect();
    return r && r.width && e.offsetParent !== null ? [r.left, r.top, r.right, r.bottom] : null; };
  const kArea = box(gd.querySelector('.xy .nsewdrag, .nsewdrag'));
  return {title: box(gd.querySelector('.gtitle')), modebar: box(gd.querySelector('.modebar')),
          kArea, yLabels: [...gd.querySelectorAll('.yaxislayer-above text')]
            .map(box).filter((b) => b && kArea && b[0] > kArea[0] + 2)}; }"""


def _hit(a, b) -> bool:
    return bool(a and b) and a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_inspector_on_a_phone_keeps_its_title_and_heatmaps_apart(browser, served_app):
    from tests.helpers import click_until
    from tests.ui.test_browser import CELL_XY

    pg = _phone(browser, served_app)
    try:
        pg.click("#new-seq")
        pg.wait_for_function("() => (document.querySelector('#event-log')?.innerText ?? '')"
                             ".includes('prefill')", timeout=120_000)
        pg.wait_for_function(f"() => ({CELL_XY})(['pool', 0]) !== null && ({IDLE})()", timeout=60_000)
        pg.locator("#pool-plot").scroll_into_view_if_needed()
        click_until(pg, CELL_XY, ["pool", 0],
                    "() => !!document.querySelector('#kv-plot .js-plotly-plot')?._fullLayout")
        pg.locator("#kv-plot").scroll_into_view_if_needed()
        parts = drawn(pg, KV_PARTS)
        assert not _hit(parts["title"], parts["modebar"]), parts  # the toolbar over the title
        assert not any(_hit(b, parts["kArea"]) for b in parts["yLabels"]), parts  # V's on K
    finally:
        pg.close()


def test_the_preemption_workload_on_a_phone_cuts_no_line(browser, served_app):
    """The lines under and over a phone's picture ("waiting…", "seq N, block by block", "GPU
    pool…") stay inside it at every step of a run that preempts (issue 42, item 9)."""
    pg = _phone(browser, served_app)
    try:
        _workload(pg, "preemption (a pool too small)")
        seen, end = "", pg.evaluate(POSITION)
        for position in range(end - 5, end - 45, -5):  # eight points of the run, 5 apart
            _goto(pg, position)
            assert drawn(pg, CUT, "#pool-plot") == [], pg.evaluate("document.querySelector('#status')"
                                                                    "?.innerText")
            seen += pg.evaluate("() => [...document.querySelectorAll('#pool-plot .main-svg text')]"
                                ".map((t) => t.textContent).join(' ')")
        assert "waiting" in seen and "block by block" in seen  # the lines were drawn, and whole
    finally:
        pg.close()
