"""Back and Next in a real browser, from the click to the picture drawn: what a visitor waits for.

bench/ui_latency.py times the server's side of a click (the operation and the figure's JSON);
this one times what the page shows. The app runs on the default model (SmolLM2-135M, CPU);
Debian's Chromium opens it on a 390 x 844 phone and at 1440 x 900, loads Serving's preemption
workload, runs it to the end with the request timeline under the picture, then presses Back and
Next over the recorded run. For each click, in the page's own clock, from the pointer's press in
the page (the clock from before Playwright's click call, which adds its own wait for the button to
be in view and still, is kept as picture_call_ms / view_call_ms):

- picture: the click until the status line names the new position, the main picture's element is
  a new one, drawn (Plotly laid it out), and no event is under way;
- view: the click until the view under the picture is drawn for it too (it comes with the
  picture, and the page draws it after the picture: ui/draws.js).

Targets (2-core CPU): picture median <= 300 ms and view median <= 600 ms on the phone.

    python bench/browser_latency.py [--out bench/results/browser_latency.json] [--clicks 12]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ui.app_process import free_port, launch, stop  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
IDLE = "![...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null)"
# the page's clock: the click, then the moments the picture and the view were drawn for it. t0 is
# taken before Playwright's click call: the old clock, kept as *_call_ms. The call waits for the
# button to be scrolled into view and to stand still (on a phone the page scrolls the picture
# back into view after each move) and for the page to answer its checks: 200-430 ms on the busy
# 2-core machine. `press` is the pointer's press: its event's time stamp, taken when the input
# arrived, before the page handled it
ARM = """() => { const b = window.plBench = {poolEl: document.querySelector('#pool-plot .js-plotly-plot'),
  viewEl: document.querySelector('#view-plot .js-plotly-plot'), t0: performance.now()};
  document.addEventListener('pointerdown', (e) => { b.press ??= e.timeStamp; },
                            {capture: true, once: true}); }"""
# null until the picture (and then the view) is drawn for the click: the new plot element laid
# out, the status line at the new position, no event under way; then [picture ms, view ms] from
# the press, and from before Playwright's click call
DRAWN = """(want) => { const b = window.plBench, now = performance.now();
  const pool = document.querySelector('#pool-plot .js-plotly-plot');
  const view = document.querySelector('#view-plot .js-plotly-plot');
  const ready = (gd) => !!gd?._fullLayout && gd.getBoundingClientRect().height > 0;
  const status = document.querySelector('#status')?.innerText ?? '';
  const idle = ![...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null);
  if (b.picture === undefined && pool !== b.poolEl && ready(pool) && status.includes(want) && idle) {
    b.picture = now - b.t0; }
  if (b.view === undefined && view !== b.viewEl && ready(view)) b.view = now - b.t0;
  const press = (b.press ?? b.t0) - b.t0;
  return b.picture !== undefined && b.view !== undefined
    ? [b.picture - press, b.view - press, b.picture, b.view] : null; }"""
POSITION = ("() => { const m = /operation (\\d+) of (\\d+)/.exec(document.querySelector('#status')"
            "?.innerText ?? ''); return m ? [+m[1], +m[2]] : null; }")


def served_run(pg, url: str) -> int:
    """Serving's preemption workload run to the end, the request timeline under the picture;
    the number of operations it took."""
    pg.goto(url)
    pg.wait_for_selector("#new-seq", timeout=180_000)
    pg.wait_for_function(f"() => {IDLE}", timeout=120_000)
    pg.get_by_role("tab", name="Serving").click()
    pg.locator("#workload input").click()
    pg.get_by_role("option", name="preemption (a pool too small)").click()
    pg.locator("#load-workload").click()
    pg.wait_for_function(f"() => {{ const p = ({POSITION})(); return !!p && p[1] >= 4 && {IDLE}; }}",
                         timeout=180_000)
    pg.get_by_role("button", name="Run to the end").click()
    pg.wait_for_function(f"() => {{ const p = ({POSITION})(); return !!p && p[0] === p[1] "
                         f"&& p[1] > 20 && {IDLE}; }}", timeout=900_000)
    pg.wait_for_function("() => !!document.querySelector('#view-plot .js-plotly-plot')?._fullLayout",
                         timeout=120_000)
    return pg.evaluate(POSITION)[1]


def clicks(pg, button: str, count: int, step: int) -> list[tuple[float, ...]]:
    """Press `button` `count` times; each click's (picture ms, view ms) from the press, then
    from the call, in the page's clock."""
    out = []
    for _ in range(count):
        pos, total = pg.evaluate(POSITION)
        want = f"operation {pos + step} of {total}"
        pg.evaluate(ARM)
        pg.click(button)
        out.append(tuple(pg.wait_for_function(DRAWN, arg=want, timeout=120_000).json_value()))
        pg.wait_for_function(f"() => {IDLE}", timeout=60_000)
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "max": round(max(values), 1),
            "min": round(min(values), 1), "clicks": len(values)}


def measure(browser, url: str, viewport: dict, count: int) -> dict:
    pg = browser.new_page(viewport=viewport)
    try:
        ops = served_run(pg, url)
        back = clicks(pg, "#tl-back", count, -1)
        nxt = clicks(pg, "#tl-next", count, +1)
    finally:
        pg.close()
    both = back + nxt
    return {"operations": ops, "picture_ms": summary([c[0] for c in both]),
            "view_ms": summary([c[1] for c in both]),
            "back_picture_ms": summary([c[0] for c in back]),
            "next_picture_ms": summary([c[0] for c in nxt]),
            "picture_call_ms": summary([c[2] for c in both]),
            "view_call_ms": summary([c[3] for c in both])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/browser_latency.json")
    ap.add_argument("--clicks", type=int, default=12)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = launch(["app.py"], port, timeout=300)
    load = os.getloadavg()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            results = {name: measure(browser, f"http://127.0.0.1:{port}/", vp, args.clicks)
                       for name, vp in (("phone_390x844", {"width": 390, "height": 844}),
                                        ("laptop_1440x900", {"width": 1440, "height": 900}))}
            browser.close()
    finally:
        stop(proc)
    out = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "load_average_at_start": load, "load_average_at_end": os.getloadavg(),
                       "when": time.strftime("%Y-%m-%d %H:%M")},
           "what": "Serving, preemption workload run to the end on SmolLM2-135M (CPU), timeline "
                   "under the picture; Back then Next, click to picture / view drawn in Chromium",
           "targets": {"phone picture median ms": 300, "phone view median ms": 600},
           **results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for name, r in results.items():
        print(f"{name:16s} picture {r['picture_ms']['median']:7.1f} ms median "
              f"(max {r['picture_ms']['max']:.0f}), view {r['view_ms']['median']:7.1f} ms median "
              f"(max {r['view_ms']['max']:.0f}) over {r['picture_ms']['clicks']} clicks")


if __name__ == "__main__":
    main()
