"""Take the README's screenshots from the running app (real default model, Debian's Chromium):

    .venv/bin/python scripts/screenshots.py [--out docs]

playground-cow.png (1440 x 900: New sequence, Append, Fork, Append = a copy-on-write),
beam-search.png (a beam-search request after a few scheduler steps), lesson.png (lesson 3 at its
copy-on-write step), phone.png (390 x 844 after New sequence), presenter.png (presenter mode)."""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ui.app_process import free_port, launch, stop  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
HANDLED = ("() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');"
           " return gd && gd.layout && window.plAnimated === gd.layout.meta.anim; }")


def wait_log(pg, text: str) -> None:
    pg.wait_for_function("(t) => document.querySelector('#event-log').innerText.includes(t)", arg=text,
                         timeout=120_000)


def settle(pg) -> None:
    pg.wait_for_function(HANDLED, timeout=60_000)
    pg.wait_for_timeout(700)  # the step's motion (<= 0.5 s) has ended


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = launch(["app.py"], port)
    url = f"http://127.0.0.1:{port}/"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
            pg = browser.new_page(viewport={"width": 1440, "height": 900})
            pg.goto(url)
            pg.wait_for_selector("#new-seq", timeout=120_000)
            for selector, text in (("#new-seq", "prefill"), ("#append", "wrote"), ("#fork", "forked"),
                                   ("#append", "copy-on-write")):
                pg.click(selector)
                wait_log(pg, text)
            settle(pg)
            pg.screenshot(path=os.path.join(out, "playground-cow.png"))

            pg.click("#presenter")
            # the picture is redrawn in presenter size (title type 16 px x 1.35) by the server
            pg.wait_for_function("() => document.querySelector('#pool-plot .js-plotly-plot')"
                                 "?.layout?.title?.font?.size > 20", timeout=60_000)
            settle(pg)
            pg.screenshot(path=os.path.join(out, "presenter.png"))
            pg.click("#presenter")

            pg.get_by_role("tab", name="Serving").click()
            pg.get_by_label("beam width").fill("3")
            pg.get_by_label("max tokens").fill("12")
            for selector in ("#add-request", *["#serve-step"] * 5):
                before = pg.locator("#status").inner_text()  # "... operation k of k"
                pg.click(selector)
                pg.wait_for_function("(o) => document.querySelector('#status').innerText !== o",
                                     arg=before, timeout=120_000)
            settle(pg)
            pg.screenshot(path=os.path.join(out, "beam-search.png"))

            pg.goto(url + "?lesson=03_fork_cow&step=3")
            pg.wait_for_function("() => document.body.innerText.includes('step 3 of')", timeout=120_000)
            settle(pg)
            pg.screenshot(path=os.path.join(out, "lesson.png"))

            phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            phone.goto(url)
            phone.wait_for_selector("#new-seq", timeout=120_000)
            phone.click("#new-seq")
            wait_log(phone, "prefill")
            phone.evaluate("window.scrollTo(0, 0)")
            settle(phone)
            phone.screenshot(path=os.path.join(out, "phone.png"))
            browser.close()
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
