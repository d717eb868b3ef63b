"""The walkthrough's views of the run (scripts/walkthrough.py --only views), on the real model:

- Serving in presenter mode at 1280 x 720: the "preemption" workload run to the end, then a
  click on a timeline cell mid-run (that step, that request's blocks outlined):
  timeline-presenter.png; memory over time at the same step: memory-presenter.png;
- the "shared prefix" workload, the prefix cache as a tree mid-run: prefix-tree-presenter.png;
- the timeline on a 390 x 844 phone: timeline-phone.png;
- lesson 5's second page (the prefix hit, the tree's trunk and branches) in presenter mode:
  lesson5-tree.png (lesson 12's pages show the timeline: presenter-lesson12-N.png).
Every wait is on a condition in the page.
"""

from __future__ import annotations

import os

PROJECTOR, PHONE = (1280, 720), (390, 844)
IDLE = "() => ![...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null)"
STATUS = "() => document.querySelector('#status')?.innerText ?? ''"
META = "() => document.querySelector('#view-plot .js-plotly-plot')?.layout?.meta ?? null"
DONE = ("() => { const m = /operation (\\d+) of (\\d+)/.exec(document.querySelector('#status')"
        "?.innerText ?? ''); return !!m && m[1] === m[2]; }")
OPS = ("() => +(/operation \\d+ of (\\d+)/.exec(document.querySelector('#status')?.innerText ?? '')"
       "?.[1] ?? -1)")  # the operations in the log
CELL_XY = """([x, y]) => {
  const gd = document.querySelector('#view-plot .js-plotly-plot');
  const xa = gd?._fullLayout?.xaxis, ya = gd?._fullLayout?.yaxis;
  if (!xa || !ya) return null;
  const r = gd.getBoundingClientRect();
  return [r.left + xa._offset + xa.l2p(x), r.top + ya._offset + ya.l2p(y)];
}"""


def _page(browser, size, url):
    pg = browser.new_page(viewport={"width": size[0], "height": size[1]})
    pg.goto(url)
    pg.wait_for_selector("#pool-plot .js-plotly-plot", timeout=180_000)
    return pg


def _wait_view(pg, condition: str) -> dict:
    pg.wait_for_function(f"() => {{ const m = ({META})(); return !!m && ({condition}); }}",
                         timeout=180_000)
    pg.wait_for_function(IDLE, timeout=180_000)
    return pg.evaluate(META)


def _workload(pg, name: str) -> None:
    pg.get_by_role("tab", name="Serving").click()
    pg.locator("#workload input").click()
    pg.get_by_role("option", name=name).click()
    before = pg.evaluate(STATUS)
    pg.locator("#load-workload").click()
    pg.wait_for_function(f"(b) => ({STATUS})() !== b && ({DONE})()", arg=before, timeout=180_000)
    pg.wait_for_function(IDLE, timeout=180_000)
    added = pg.evaluate(OPS)  # the workload's requests, added
    for attempt in range(3):  # a click that landed while the page redrew is lost: again
        pg.get_by_role("button", name="Run to the end").click()
        try:
            pg.wait_for_function(f"(n) => ({OPS})() > n", arg=added, timeout=60_000)
            break
        except Exception:
            if attempt == 2:
                raise
    pg.wait_for_function(f"(n) => ({DONE})() && ({OPS})() > n", arg=added, timeout=600_000)
    pg.wait_for_function(IDLE, timeout=180_000)


def _choose(pg, view: str, key: str) -> dict:
    pg.locator("#view-choice").get_by_text(view, exact=True).click()
    return _wait_view(pg, f"m.view === '{key}'")


def _click_cell(pg, x: float, y: float) -> None:
    pg.locator("#view-plot .js-plotly-plot").scroll_into_view_if_needed()
    pg.mouse.click(*pg.evaluate(CELL_XY, [x, y]))


def _slide(pg) -> None:
    pg.click("#presenter")
    pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")


def _lesson_page(browser, url: str, name: str, page: int, path: str) -> None:
    pg = _page(browser, PROJECTOR, url + f"?lesson={name}&step={page}")
    pg.wait_for_function(f"() => /page {page} of/.test(document.querySelector('#lesson-progress')"
                         "?.innerText ?? '')", timeout=300_000)
    _slide(pg)
    _wait_view(pg, "true")
    pg.wait_for_function(IDLE, timeout=180_000)
    pg.wait_for_timeout(1500)  # the picture's own motion (ui/motion.js) is under half a second
    pg.screenshot(path=path)
    pg.close()


def views(browser, url: str, out: str) -> None:
    pg = _page(browser, PROJECTOR, url)
    _slide(pg)
    _workload(pg, "preemption (a pool too small)")
    meta = _wait_view(pg, "m.view === 'timeline'")
    middle = len(meta["columns"]) * 2 // 5
    row = next(i for i, r in enumerate(meta["rows"]) if r[0] == 2)
    _click_cell(pg, middle, row)
    _wait_view(pg, f"m.cursor === {middle}")
    pg.screenshot(path=os.path.join(out, "timeline-presenter.png"))
    _choose(pg, "memory", "memory")
    pg.screenshot(path=os.path.join(out, "memory-presenter.png"))
    _workload(pg, "a shared prefix (one system prompt)")
    meta = _choose(pg, "prefix tree", "tree")
    for back in (1, 2):  # mid-run: the requests hold the trunk
        pg.click("#tl-back")
        pg.wait_for_function(f"(k) => ({STATUS})().includes(`operation ${{k}} of`)",
                             arg=pg.evaluate(OPS) - back, timeout=60_000)
        pg.wait_for_function(IDLE, timeout=180_000)
    _wait_view(pg, "m.view === 'tree' && m.held > 0")
    pg.wait_for_function(IDLE, timeout=180_000)
    pg.screenshot(path=os.path.join(out, "prefix-tree-presenter.png"))
    pg.close()
    phone = _page(browser, PHONE, url)
    _workload(phone, "beams and samples")
    _wait_view(phone, "m.view === 'timeline'")
    phone.locator("#view-plot").scroll_into_view_if_needed()
    phone.screenshot(path=os.path.join(out, "timeline-phone.png"))
    phone.close()
    _lesson_page(browser, url, "05_prefix_caching", 2, os.path.join(out, "lesson5-tree.png"))
