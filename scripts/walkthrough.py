"""A teacher's walkthrough of PagedLab in a real browser (Debian's Chromium), saving a screenshot
of every view a class would see; the README's pictures are these.

    .venv/bin/python scripts/walkthrough.py [--out docs] [--only lesson,serving,classroom,...]

1. landing.png: the page a newcomer opens (1440 x 900).
2. Lesson 3 in presenter mode at 1280 x 720, one screenshot per page (presenter-lesson3-N.png)
   and the copy-on-write page as presenter.png; the same lesson page at 1440 x 900 (lesson.png).
3. The playground: New sequence, Append, Fork, Append = a copy-on-write (playground-cow.png), and
   the same on a 390 x 844 phone after New sequence (phone.png).
4. Serving: a request with n = 4 samples and one with beam width 3, run to the end
   (serving-n4-beams.png), and the beams mid-run (beam-search.png).
5. A classroom: the teacher opens a room, three students send prompts from their phones, the
   teacher shrinks the pool (classroom-projector.png at 1280 x 720, classroom-student.png), and
   shows the class's prefix cache as a tree under the picture (classroom-tree.png).
6. Lesson 12, speculative decoding, in presenter mode (presenter-lesson12-N.png,
   speculative-decoding.png); lessons 13 and 14, a sliding window and the CPU tier
   (presenter-lesson13-N.png, sliding-window.png, presenter-lesson14-N.png, cpu-tier.png).
7. A hybrid model (tiny-hybrid) in the playground, opened from a trace link: a sequence past its
   window, forked, the fork appended (hybrid-playground.png at 1440 x 900, phone-hybrid.png).
8. The views of the run: the request timeline, memory over time and the prefix tree in Serving
   and lessons 5 and 11 in presenter mode, the timeline on a phone (scripts/walkthrough_views.py).
Every wait is on a condition in the page; the app runs on the real default model.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts.walkthrough_views import views  # noqa: E402
from ui.app_process import free_port, launch, stop  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
PROJECTOR, WIDE, PHONE = (1280, 720), (1440, 900), (390, 844)
# the picture is drawn and its step's motion has been handled (ui/motion.js sets plAnimated)
SETTLED = ("() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');"
           " return !!(gd?.layout?.meta && window.plAnimated === gd.layout.meta.anim); }")
# every motion the page started has played to its end (endless ones, such as a spinner, aside)
MOTION_DONE = ("() => document.getAnimations().every((a) => a.playState === 'finished'"
               " || a.effect?.getComputedTiming().iterations === Infinity)")
STEPS = ("lesson", "playground", "serving", "classroom", "speculation", "memory", "hybrid",
         "views")
# the picture shows a step that kept some draft tokens and rejected others
DRAFTS_KEPT_AND_REJECTED = ("() => { const names = (document.querySelector('#pool-plot .js-plotly-plot')"
                            "?._fullData ?? []).map((t) => t.name);"
                            " return names.includes('draft kept') && names.includes('draft rejected'); }")
# the picture has a trace of this name (format it in)
TRACE_SHOWN = ("() => (document.querySelector('#pool-plot .js-plotly-plot')?._fullData ?? [])"
               ".some((t) => t.name === '{}')")
# no event under way: no Gradio progress tracker shows anywhere on the page
IDLE = "() => ![...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null)"


def text_of(pg, selector: str) -> str:
    return pg.evaluate("(s) => document.querySelector(s)?.innerText ?? ''", selector)


def wait_text(pg, selector: str, pattern: str, timeout: int = 180_000) -> None:
    """Wait until the element's text matches the regex (a missing element is 'not yet')."""
    pg.wait_for_function("([s, p]) => new RegExp(p).test(document.querySelector(s)?.innerText ?? '')",
                         arg=[selector, pattern], timeout=timeout)


def wait_changed(pg, selector: str, before: str, timeout: int = 180_000) -> None:
    # and done: Gradio's status ("0.0s") shows in the element while the event runs, and a click
    # on a busy button is dropped
    pg.wait_for_function("([s, b]) => { const t = document.querySelector(s)?.innerText;"
                         f" return t !== undefined && t !== b && ({IDLE})(); }}",
                         arg=[selector, before], timeout=timeout)


def settle(pg) -> None:
    pg.wait_for_function(SETTLED, timeout=120_000)
    pg.wait_for_function(MOTION_DONE, timeout=30_000)  # the screenshot shows the end state


def new_page(browser, size: tuple[int, int], url: str, scale: float = 1):
    pg = browser.new_page(viewport={"width": size[0], "height": size[1]}, device_scale_factor=scale)
    pg.goto(url)
    # attached, not visible: a lesson link may open the Lessons tab before Playground shows
    pg.wait_for_selector("#new-seq", state="attached", timeout=180_000)
    pg.wait_for_function(SETTLED, timeout=180_000)
    return pg


def landing(browser, url: str, out: str) -> None:
    pg = new_page(browser, WIDE, url)
    settle(pg)
    pg.screenshot(path=os.path.join(out, "landing.png"))
    pg.close()


def lesson(browser, url: str, out: str) -> None:
    """Lesson 3 as a teacher projects it: presenter mode on, Next (the → key) page by page."""
    play_lesson(browser, url, "03_fork_cow", os.path.join(out, "presenter-lesson3-{}.png"),
                os.path.join(out, "presenter.png"),
                "() => document.querySelector('#event-log')?.innerText.includes('copy-on-write')")
    one_view(browser, WIDE, url + "?lesson=03_fork_cow&step=3", (), ("#lesson-progress", "3 of"),
             os.path.join(out, "lesson.png"))


def speculation(browser, url: str, out: str) -> None:
    """Lesson 12 (speculative decoding) in presenter mode, page by page."""
    play_lesson(browser, url, "12_speculative_decoding",
                os.path.join(out, "presenter-lesson12-{}.png"),
                os.path.join(out, "speculative-decoding.png"), DRAFTS_KEPT_AND_REJECTED)


def memory_2026(browser, url: str, out: str) -> None:
    """Lessons 13 (a hybrid model's sliding table) and 14 (the CPU tier) in presenter mode."""
    play_lesson(browser, url, "13_sliding_window", os.path.join(out, "presenter-lesson13-{}.png"),
                os.path.join(out, "sliding-window.png"), TRACE_SHOWN.format("dropped entries"))
    play_lesson(browser, url, "14_cpu_tier", os.path.join(out, "presenter-lesson14-{}.png"),
                os.path.join(out, "cpu-tier.png"), TRACE_SHOWN.format("load"))


def hybrid(browser, url: str, out: str) -> None:
    """tiny-hybrid in the playground: each sequence's full and sliding rows, the sliding ones'
    first entries dropped, a fork's copy-on-write in both groups. The session is built here and
    opened by its trace link (the page replays it), as a student's shared link would be."""
    from engine import EngineConfig, ops
    from ui.session import Session

    session = Session(EngineConfig(model="tiny-hybrid", block_size=8, num_gpu_blocks=48,
                                   num_cpu_blocks=48, preemption_mode="swap"))
    for op in (ops.AddSequence("Hybrid models alternate full layers and sliding windows."),
               ops.Append(0, n=40), ops.Fork(0), ops.Append(1, n=3)):
        session.run(op)
    link = url + "?trace=" + session.to_link()
    for size, name in ((WIDE, "hybrid-playground.png"), (PHONE, "phone-hybrid.png")):
        one_view(browser, size, link, (), ("#event-log", "copy-on-write"), os.path.join(out, name))


def play_lesson(browser, url: str, name: str, pages: str, telling: str, shows: str) -> None:
    """Open a lesson at 1280 x 720 in presenter mode and press → page by page to its end,
    saving each screen (`pages` formats the page number) and the first one where the JS
    condition `shows` holds as `telling`."""
    pg = new_page(browser, PROJECTOR, url + f"?lesson={name}")
    wait_text(pg, "#lesson-progress", r"page \d+ of")
    pg.click("#presenter")
    pg.wait_for_function("() => document.body.classList.contains('pl-presenter')")
    page, told = 0, False
    while True:
        settle(pg)
        pg.wait_for_function(IDLE, timeout=180_000)  # nothing under way: one key, one page
        pg.screenshot(path=pages.format(page))
        progress = text_of(pg, "#lesson-progress")
        print(f"[walkthrough] {name}, screen {page}: {progress}", flush=True)
        if not told and pg.evaluate(shows):
            pg.screenshot(path=telling)
            told = True
        if "the end" in progress or page > 20:
            break
        pg.keyboard.press("ArrowRight")
        # the next page is there, done (not Gradio's "0.0s" or "processing | 1.3s" in the same element)
        pg.wait_for_function("(b) => { const t = document.querySelector('#lesson-progress')?.innerText"
                             f" ?? ''; return /page \\d+ of/.test(t) && t !== b && ({IDLE})(); }}",
                             arg=progress, timeout=180_000)
        page += 1
    pg.close()


def one_view(browser, size: tuple[int, int], url: str, clicks: tuple, until: tuple[str, str],
             path: str, scale: float = 1) -> None:
    """Open a page, click each (selector, what the event log then says), wait until `until`
    (selector, pattern) holds, and save the settled view."""
    pg = new_page(browser, size, url, scale)
    for selector, said in clicks:
        pg.click(selector)
        wait_text(pg, "#event-log", said)
    wait_text(pg, *until)
    settle(pg)
    pg.screenshot(path=path)
    pg.close()


def playground(browser, url: str, out: str) -> None:
    cow = (("#new-seq", "prefill"), ("#append", "wrote"), ("#fork", "forked"),
           ("#append", "copy-on-write"))
    one_view(browser, WIDE, url, cow, ("#event-log", "copy-on-write"),
             os.path.join(out, "playground-cow.png"))
    one_view(browser, PHONE, url, (("#new-seq", "prefill"),), ("#event-log", "prefill"),
             os.path.join(out, "phone.png"), scale=2)


def serving(browser, url: str, out: str) -> None:
    """Two requests, one sampling n = 4 and one searching with beam width 3, run to the end."""
    pg = new_page(browser, WIDE, url)
    pg.get_by_role("tab", name="Serving").click()
    for prompt, n, beams, temp in (("Paged memory is", "4", "1", "0.8"),
                                   ("The best way to learn is", "1", "3", "0")):
        pg.get_by_label("request prompt").fill(prompt)
        pg.get_by_label("n samples").fill(n)
        pg.get_by_label("beam width").fill(beams)
        pg.get_by_label("temperature").fill(temp)
        pg.get_by_label("max tokens").fill("12")
        status = text_of(pg, "#status")
        pg.click("#add-request")
        wait_changed(pg, "#status", status)
    for _ in range(4):
        status = text_of(pg, "#status")
        pg.click("#serve-step")
        wait_changed(pg, "#status", status)
    settle(pg)
    pg.screenshot(path=os.path.join(out, "beam-search.png"))
    status = text_of(pg, "#status")
    pg.get_by_role("button", name="Run to the end").click()
    wait_changed(pg, "#status", status)
    wait_text(pg, "#sequences", "finished")
    settle(pg)
    pg.screenshot(path=os.path.join(out, "serving-n4-beams.png"), full_page=True)
    pg.close()


def settle_room(pg) -> None:
    """The room's picture has stopped changing size (its 1 s timer redraws it for the new box)."""
    pg.wait_for_function("() => { const gd = document.querySelector('#room-plot .js-plotly-plot');"
                         " const h = gd?._fullLayout?.height; const same = h === window.plRoomH;"
                         " window.plRoomH = h; return !!h && same; }", polling=1500, timeout=60_000)
    pg.wait_for_function(MOTION_DONE, timeout=30_000)


def classroom(browser, url: str, out: str) -> None:
    """The teacher opens a room, three students send prompts, the teacher shrinks the pool."""
    teacher = browser.new_page(viewport={"width": PROJECTOR[0], "height": PROJECTOR[1]})
    teacher.goto(url + "class")
    teacher.wait_for_selector("#room-open", timeout=180_000)
    teacher.click("#room-open")
    teacher.wait_for_function("() => /Room [A-Z0-9]+/.test(document.querySelector('#room-joined')"
                              "?.innerText ?? '')", timeout=180_000)
    code = re.search(r"Room ([A-Z0-9]+)", text_of(teacher, "#room-joined")).group(1)
    students = []
    for name, prompt in (("Ada", "Why is the sky blue?"), ("Linus", "What is a kernel?"),
                         ("Grace", "Tell me about compilers.")):
        st = browser.new_page(viewport={"width": PHONE[0], "height": PHONE[1]}, device_scale_factor=2)
        st.goto(url + f"room?code={code}")
        st.wait_for_selector("#student-send", timeout=180_000)
        st.wait_for_function("(c) => document.querySelector('#student-code textarea, "
                             "#student-code input')?.value === c", arg=code, timeout=60_000)
        st.locator("#student-name textarea, #student-name input").first.fill(name)
        st.locator("#student-prompt textarea").first.fill(prompt)
        st.click("#student-send")
        students.append(st)
    for i, st in enumerate(students):
        try:
            wait_text(st, "#student-mine", "done|finished", timeout=300_000)
        except Exception:
            print("[walkthrough] student page says:", text_of(st, "body")[:600], flush=True)
            st.screenshot(path=f"/tmp/walk-student-{i}.png")
            teacher.screenshot(path="/tmp/walk-teacher.png", full_page=True)
            raise
    teacher.get_by_label("blocks for the class").fill("8")
    teacher.click("#room-shrink")
    wait_text(teacher, "#room-metrics-box", "reserved")
    teacher.wait_for_function(  # the projector redraws on its 1 s timer
        "() => !!document.querySelector('#room-plot .js-plotly-plot')?.data"
        "?.some((t) => t.name === 'reserved by the teacher')", timeout=60_000)
    teacher.evaluate("window.scrollTo(0, 0)")  # the class sees the top of the projector page
    teacher.click("#room-projector")  # the projector view: the teacher's controls off the screen
    teacher.wait_for_function("() => { const gd = document.querySelector('#room-plot .js-plotly-plot');"
                              " return !!gd?.layout?.meta?.fit?.fitted && document.body.classList"
                              ".contains('pl-projector'); }", timeout=60_000)
    settle_room(teacher)
    teacher.screenshot(path=os.path.join(out, "classroom-projector.png"))
    students[0].screenshot(path=os.path.join(out, "classroom-student.png"))
    # the class's prefix cache as a tree under the projector's picture: the system prompt's trunk
    teacher.click("#room-projector")  # the view's choice is the teacher's, off the projector
    teacher.locator("#room-view-choice").get_by_text("prefix tree", exact=True).click()
    teacher.click("#room-projector")
    teacher.wait_for_function("() => document.querySelector('#room-view-plot .js-plotly-plot')"
                              "?.layout?.meta?.view === 'tree'", timeout=60_000)
    settle_room(teacher)
    teacher.screenshot(path=os.path.join(out, "classroom-tree.png"))
    for pg in (teacher, *students):
        pg.close()


def _keep_what_failed(browser, out: str, part: str) -> None:
    """The pages a failed walk left open, as they were (failed-<part>-N.png): what it waited on."""
    for ctx in browser.contexts:
        for i, pg in enumerate(ctx.pages):
            path = os.path.join(out, f"failed-{part}-{i}.png")
            pg.screenshot(path=path)
            print(f"[walkthrough] {part} failed: {path} ({pg.url})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs")
    ap.add_argument("--only", default=",".join(("landing", *STEPS)))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = launch(["app.py"], port)
    url = f"http://127.0.0.1:{port}/"
    walks = {"landing": landing, "lesson": lesson, "playground": playground, "serving": serving,
             "classroom": classroom, "speculation": speculation, "memory": memory_2026, "hybrid": hybrid,
             "views": views}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox"])
            for part in args.only.split(","):
                print(f"[walkthrough] {part}", flush=True)
                try:
                    walks[part](browser, url, args.out)
                except Exception:
                    _keep_what_failed(browser, args.out, part)
                    raise
            browser.close()
    finally:
        stop(proc)
    print(f"[walkthrough] screenshots in {args.out}/")


if __name__ == "__main__":
    main()
