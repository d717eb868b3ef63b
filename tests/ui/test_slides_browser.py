"""Every page of every lesson is a slide in presenter mode (issue 37), in a real browser: at
1280 x 720 (forward, Next by Next) and, at 1920 x 1080, each lesson's last page,
nothing scrolls, the picture (with the view of the run under it, where the lesson shows one)
takes at least half of the screen, the page's key sentence is on
screen at 24 px or more and the rest of its text at 20 px or more, the question and Back / Next
are in view, and the picture shows every token and every physical id whole (no "…", every text
inside its cell) in type of 14 px or more. Lessons 12-14 draw, somewhere on the walk, what their
mechanism adds to the picture (DRAWS).

A test per lesson (the two test workers share them out), one page load each; the window is
resized once. The suite walks two lessons (IN_THE_SUITE); `python bench/walks.py slides` walks them all.
Every wait is on a condition that is false (never an error) while the page renders.
"""

from __future__ import annotations

import os
import shutil

import pytest

from lessons import load_all
from tests.helpers import BUSY, server_errors
from tests.ui.test_browser import IDLE

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed")]
# The suite walks these lessons: copy-on-write's arrows and shared tails, and the sliding
# window's dropped table entries (a mark of DRAWS). The walk of all fifteen, DRAWS of lessons 12
# and 14 with it (433 s of browser and app time on a quiet 2-core machine; 47 s for these two
# in a suite run, where 12 and 14 took 63 s more) is `python bench/walks.py slides` (results
# committed: bench/results/slides_walk.json), after any change to a lesson's text or the
# picture's layout.
# PAGEDLAB_SLIDE_LESSONS=all, or a list (03_fork_cow,05_prefix_caching), walks those here.
IN_THE_SUITE = ("03_fork_cow", "13_sliding_window")
ASKED = os.environ.get("PAGEDLAB_SLIDE_LESSONS", "")
ONLY = IN_THE_SUITE if not ASKED else None if ASKED == "all" else [n for n in ASKED.split(",") if n]
LESSONS = [lesson.name for lesson in load_all() if ONLY is None or lesson.name in ONLY]
SHOTS = os.environ.get("PAGEDLAB_SLIDE_SHOTS")  # a folder: save every slide there as a PNG
# what the memory of 2026 engines must draw somewhere on the walk (the picture's trace names):
# speculative decoding its kept and rejected draft slots, the hybrid lesson its dropped table
# entries, the tier lesson its CPU tier and a block coming back
DRAWS = {"12_speculative_decoding": {"draft kept", "draft rejected"},
         "13_sliding_window": {"dropped entries"}, "14_cpu_tier": {"cpu tier", "load"}}
# every trace name the picture draws, gathered while the walk runs (a page may redraw between
# two polls of the test)
GATHER_NAMES = """() => { window.plSeen = new Set();
  setInterval(() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');
    (gd?._fullData ?? []).forEach((t) => window.plSeen.add(t.name)); }, 50); }"""

PROGRESS = "() => document.querySelector('#lesson-progress')?.innerText ?? ''"
# the page's picture is drawn for this window: its box was measured and the figure redrawn to it
FITTED = """([w, h]) => { const gd = document.querySelector('#pool-plot .js-plotly-plot');
  const box = gd?.layout?.meta?.fit?.box, col = document.querySelector('#picture-col');
  if (!box || !col || !gd._fullLayout || innerWidth !== w || innerHeight !== h) return false;
  const r = col.getBoundingClientRect();
  // the view of the run under the picture has come (or gone) as the picture says
  const view = document.querySelector('#view-plot .js-plotly-plot');
  const shown = !!view?._fullLayout && view.getBoundingClientRect().height > 0;
  if (shown !== !!gd.layout.meta.fit.view) return false;
  // and was drawn for what the picture leaves it (its follower redraws it after the picture)
  const room = gd.layout.meta.fit.view_h;
  if (shown && room && view.layout.height > room + 1) return false;
  return Math.abs(box[0] - r.width) < 7 && Math.abs(box[1] - (innerHeight - r.top - 18)) < 7; }"""
# what a slide must be, measured in the page: null while it renders, else a list of problems
SLIDE = """() => {
  const gd = document.querySelector('#pool-plot .js-plotly-plot');
  const key = document.querySelector('#lesson-narration blockquote');
  const next = document.querySelector('#lesson-next');
  if (!gd?._fullLayout || !gd.layout?.meta?.fit || !key || !next) return null;
  const bad = [], W = innerWidth, H = innerHeight, px = (e) => parseFloat(getComputedStyle(e).fontSize);
  const de = document.documentElement;
  if (de.scrollHeight > H + 1 || de.scrollWidth > W + 1) {
    bad.push(`scrolls: ${de.scrollWidth}x${de.scrollHeight}`);
  }
  // the picture's region: the pool and, where the page shows one, the view of the run under it
  // (issue 34), from the pool's top to the view's bottom
  const pic = gd.getBoundingClientRect();
  const view = document.querySelector('#view-plot .js-plotly-plot')?.getBoundingClientRect();
  const bottom = view?.height ? Math.max(view.bottom, pic.bottom) : pic.bottom;
  const share = pic.width * (Math.min(bottom, H) - pic.top) / W / H;
  if (share < 0.5) bad.push(`picture ${Math.round(100 * share)}% of the screen`);
  if (view?.height && view.bottom > H + 1) bad.push(`the view under the picture ends at ${view.bottom}`);
  const k = key.getBoundingClientRect();
  if (px(key) < 24 - 0.01) bad.push(`key sentence ${px(key)} px`);
  if (k.top < 0 || k.bottom > H) bad.push(`key sentence at ${Math.round(k.top)}..${Math.round(k.bottom)}`);
  for (const e of document.querySelectorAll('#lesson-narration :is(p, li, td, th), #lesson-question p')) {
    if (e.closest('blockquote') || !e.innerText.trim()) continue;
    if (px(e) < 20 - 0.01) bad.push(`text ${px(e)} px: ${e.innerText.slice(0, 40)}`);
    const r = e.getBoundingClientRect();
    if (r.bottom > H + 1 || r.right > W + 1) bad.push(`text off the slide: ${e.innerText.slice(0, 40)}`);
  }
  if (next.getBoundingClientRect().bottom > H + 1) bad.push('Next is off the slide');
  const fit = gd.layout.meta.fit;
  if (!fit.whole) bad.push(`picture not whole at ${fit.token_px} px`);
  // every text of the picture: 14 px or more, none shortened, each inside its heatmap cell
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const area = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const heat = gd._fullData.filter((t) => t.type === 'heatmap');
  // the title and its colour key end above the plot's area (the block tables' header is its top)
  const title = gd.querySelector('.gtitle')?.getBoundingClientRect();
  if (title && title.bottom > area.top + 1) bad.push(`title ends at ${title.bottom}, plot at ${area.top}`);
  for (const t of gd.querySelectorAll('.main-svg text')) {
    if (!t.textContent.trim() || t.closest('.hoverlayer')) continue;
    if (px(t) < 14 - 0.01) bad.push(`picture text ${px(t)} px: ${t.textContent}`);
    const edge = t.getBoundingClientRect();
    if (edge.right > pic.right + 1 || edge.left < pic.left - 1) bad.push(`cut at the edge: ${t.textContent}`);
    if (t.textContent.includes('…')) bad.push(`shortened: ${t.textContent}`);
    const b = t.getBoundingClientRect();
    const cx = xa.p2l((b.left + b.right) / 2 - area.left), cy = ya.p2l((b.top + b.bottom) / 2 - area.top);
    for (const h of heat) {
      const c = h.x.findIndex((x, i) => i + 1 < h.x.length && x <= cx && cx <= h.x[i + 1]);
      const r = h.y.findIndex((y) => Math.abs(y - cy) < 0.5);
      if (c < 0 || r < 0 || h.z[r]?.[c] == null || !h.text?.[r]?.[c]) continue;
      const cell = xa.l2p(h.x[c + 1]) - xa.l2p(h.x[c]);
      if (b.width > cell + 1) {
        bad.push(`cut in its cell (${Math.round(b.width)} > ${Math.round(cell)} px): ${t.textContent}`);
      }
    }
  }
  const tables = gd._fullData.find((t) => t.name === 'block tables');
  tables?.z.forEach((row, r) => row.forEach((z, c) => {
    const about = tables.customdata?.[r]?.[c]?.[1] ?? '';
    if (about.includes('→') && !/[#c]\\d+/.test(tables.text[r][c])) {
      bad.push(`table cell without its id: ${about}`);
    }
  }));
  return bad;
}"""


# what is still busy on the page (progress shown: where, and what it says), the focus and Next's state

# what the page shows while a wait for it runs out: the picture's fit and the view under it
STATE = """() => { const gd = document.querySelector('#pool-plot .js-plotly-plot');
  const v = document.querySelector('#view-plot .js-plotly-plot');
  return JSON.stringify({fit: gd?.layout?.meta?.fit, col: document.querySelector('#picture-col')
    ?.getBoundingClientRect().toJSON(), view: v ? [!!v._fullLayout, v.getBoundingClientRect().height]
    : null, idle: (%s)(), slide: (%s)()}); }"""


def _check(pg, where: str, size: tuple[int, int], problems: list[str], url: str = "") -> None:
    # drawn for this window (a redraw for an earlier box may land late: the page asks again)
    try:  # measured in the poll that finds it drawn (a redraw may empty it right after)
        bad = pg.wait_for_function(f"(s) => ({FITTED})(s) && ({IDLE})() && ({SLIDE})()",
                                   arg=list(size), timeout=120_000).json_value()
    except Exception:
        problems.append(f"{where}: never drawn for the slide: {pg.evaluate(STATE % (IDLE, SLIDE))}, "
                        f"{pg.evaluate(BUSY)}{server_errors(url)}")
        if SHOTS:
            pg.screenshot(path=os.path.join(SHOTS, where.replace(" ", "-") + "-stuck.png"))
        return
    if SHOTS:
        pg.screenshot(path=os.path.join(SHOTS, where.replace(" ", "-").replace(":", "") + ".png"))
    problems += [f"{where}: {b}" for b in bad]


def _turn(pg, key: str, size: tuple[int, int], url: str = "") -> str:
    """Press a key (→ Next, ← Back), wait for the new page drawn to fit `size`; its progress."""
    before = pg.evaluate(PROGRESS)
    pg.keyboard.press(key)
    try:
        pg.wait_for_function(f"(b) => {{ const t = ({PROGRESS})(); return /page \\d+ of/.test(t) "
                             f"&& t !== b && ({IDLE})(); }}", arg=before, timeout=180_000)
    except Exception as e:  # the press did nothing, or the page never came to rest: which
        raise AssertionError(f"after {key} from '{before}': the page shows '{pg.evaluate(PROGRESS)}', "
                             f"{pg.evaluate(BUSY)}{server_errors(url)}") from e
    try:
        pg.wait_for_function(FITTED, arg=list(size), timeout=60_000)
    except Exception as e:  # say what the page showed: the box, the picture's fit, the view
        raise AssertionError(f"after {key} from '{before}': never drawn for {size}: "
                             f"{pg.evaluate(STATE % (IDLE, SLIDE))}") from e
    return pg.evaluate(PROGRESS)


@pytest.mark.parametrize("name", LESSONS)
def test_every_page_of_the_lesson_is_a_slide_at_1280x720_and_1920x1080(browser, served_app, name):
    small, big = (1280, 720), (1920, 1080)
    pg = browser.new_page(viewport={"width": small[0], "height": small[1]})
    problems: list[str] = []  # every page is checked; all that is wrong is reported at the end
    try:
        pg.goto(served_app + f"?lesson={name}")
        pg.wait_for_function(f"() => ({PROGRESS})().includes('page 0 of')", timeout=180_000)
        if not pg.evaluate("document.body.classList.contains('pl-presenter')"):
            pg.click("#presenter")
        pg.wait_for_function(FITTED, arg=list(small), timeout=120_000)
        pg.evaluate(GATHER_NAMES)
        pages = 0
        while True:
            progress = pg.evaluate(PROGRESS)
            _check(pg, f"{name} {pages} 1280x720", small, problems, served_app)
            if "the end" in progress:
                break
            _turn(pg, "ArrowRight", small, served_app)
            pages += 1
        pg.set_viewport_size({"width": big[0], "height": big[1]})
        pg.wait_for_function(FITTED, arg=list(big), timeout=120_000)
        # the larger screen: the last page (the score under it); the smaller screen, where a
        # page is tightest, has had them all (a projector's Back: tests/ui/test_presenter_browser.py)
        _check(pg, f"{name} {pages} 1920x1080", big, problems, served_app)
        unseen = DRAWS.get(name, set()) - set(pg.evaluate("[...window.plSeen]"))
        problems += [f"{name}: the walk never drew {sorted(unseen)}"] if unseen else []
    finally:
        pg.close()
    if problems and SHOTS:
        with open(os.path.join(SHOTS, f"problems-{name}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(problems))
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
