"""Shared test helpers (no fixtures: those live in conftest.py): a full fingerprint of the block
bookkeeping, a class of clients acting at once, a room opened from the teacher's page. Whether the
Triton kernels run in this process is tests/paged_kernels/triton_mode.py's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from engine import LLMEngine


def fingerprint(eng: LLMEngine) -> tuple:
    """Everything the bookkeeping holds, orders included: equal fingerprints = identical state."""
    pool = eng.kv.pool
    return (
        eng.snapshot(),
        tuple(pool.free_ids),
        tuple(pool.cached_ids),
        tuple(sorted(pool.hash_to_block.items())),
        tuple((s.seq_id, tuple(s.block_hashes), s.pending_token) for s in eng.seqs.values()),
        eng.runtime.rng.getstate() if eng.config.dry else None,  # the dry runtime's draws
        eng.registry.next_seq_id,
    )



def at_once(n: int, work: Callable[[int, threading.Barrier], None], timeout: float = 120) -> list[str]:
    """Run work(i, start) for i in 0 .. n - 1 in n threads; each calls start.wait() once it is
    set up, so all act at the same moment. The errors, a line each."""
    errors: list[str] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            work(i, start)
        except Exception as err:  # noqa: BLE001 (reported to the caller)
            errors.append(f"{i}: {type(err).__name__}: {err}")
            start.abort()  # the others must not wait for this one

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return errors


def open_room_page(pg: Any, url: str) -> str:
    """Open a room from the teacher's page (/class, the form's defaults); the room's code."""
    pg.goto(url + "class")
    pg.wait_for_selector("#room-open", timeout=180_000)
    pg.click("#room-open")
    pg.wait_for_function("() => document.querySelector('#room-code input, #room-code textarea')"
                         "?.value.length === 6", timeout=120_000)
    return pg.locator("#room-code input, #room-code textarea").first.input_value()


def box_of(pg: Any, selector: str) -> dict:
    """An element's box in the viewport once it has one: Gradio swaps a plot's element when it
    redraws, and for that moment there is none (not yet, never an error)."""
    return pg.wait_for_function("""(sel) => { const r = document.querySelector(sel)?.getBoundingClientRect();
      return r && r.width > 0 ? {x: r.x, y: r.y, width: r.width, height: r.height} : null; }""",
                                arg=selector, timeout=60_000).json_value()


def drawn(pg: Any, fn: str, arg: Any = None, timeout: float = 60_000) -> Any:
    """The first value other than null that the page function `fn(arg)` returns, read in the poll
    that finds it: a redraw (a follower's, its progress hidden) may empty a plot again right
    after, so a second read could find nothing."""
    found = f"(a) => {{ const v = ({fn})(a); return v === null || v === undefined ? null : {{v}}; }}"
    return pg.wait_for_function(found, arg=arg, timeout=timeout).json_value()["v"]


def open_inspector(pg: Any, block: int, kv: bool = True) -> None:
    """Click `block`'s cell in the pool's picture until the inspector names it and draws its
    K/V (`kv`: the dry mode has none to draw; a click the page had not bound yet, on a busy
    machine, is clicked again)."""
    from tests.ui.test_browser import CELL_XY, IDLE  # that module imports this one

    drawn(pg, f"() => ({CELL_XY})(['pool', {block}]) !== null && ({IDLE})() || null")
    for attempt in range(5):
        x, y = drawn(pg, CELL_XY, ["pool", block])
        pg.mouse.click(x, y)
        try:
            drew = "!!document.querySelector('#kv-plot .js-plotly-plot')?._fullLayout" if kv \
                else "true"
            pg.wait_for_function(
                f"() => (document.querySelector('#inspector-note')?.innerText ?? '')"
                f".includes('Block {block}') && {drew}", timeout=30_000)
            return
        except Exception:
            if attempt == 4:
                raise


# the page position of block `want`'s cell in the picture: a strip's label cell ("pool") or a
# folded free block's id cell ("free blocks"); null until drawn
BLOCK_XY = """(want) => {
  const gd = document.querySelector('#pool-plot .js-plotly-plot');
  const drag = gd?.querySelector('.nsewdrag');
  if (!gd?._fullLayout?.xaxis || !drag) return null;
  const area = drag.getBoundingClientRect(), xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  for (const t of gd.data.filter((d) => d.name === 'pool' || d.name === 'free blocks')) {
    for (let r = 0; r < t.z.length; r++) for (let c = 0; c < t.z[r].length; c++) {
      if (t.customdata[r]?.[c]?.[0] === want) {
        return [area.left + xa.l2p((t.x[c] + t.x[c + 1]) / 2), area.top + ya.l2p(t.y[r])];
      }
    }
  }
  return null;
}"""


def click_until(pg: Any, where: str, arg: Any, done: str, tries: int = 5) -> None:
    """Click the page point the JS function `where(arg)` gives until the JS condition `done`
    holds: a click that lands while the page redraws (not bound yet) is clicked again."""
    for attempt in range(tries):
        x, y = pg.evaluate(f"({where})", arg)
        pg.mouse.click(x, y)
        try:
            pg.wait_for_function(done, timeout=10_000)
            return
        except Exception:
            if attempt == tries - 1:
                raise


# what is under way on the page while a wait for quiet runs out: each visible Gradio progress text
# with the id of the element it covers, the focus, whether Next shows, the status line
BUSY = """() => JSON.stringify({busy: [...document.querySelectorAll('.progress-text')]
  .filter((e) => e.offsetParent !== null).map((e) => `${e.closest('[id]')?.id ?? '?'}: ${e.innerText}`),
  focus: document.activeElement?.tagName + '#' + (document.activeElement?.id ?? ''),
  next: !!document.querySelector('#lesson-next')?.offsetParent,
  status: document.querySelector('#status')?.innerText?.slice(0, 120)})"""


def server_errors(url: Any) -> str:
    """The tracebacks' last lines in what the served app printed (none: ''), the last one whole
    (which event and component raised it: the app is shared by a worker's tests, so an error
    may be another page's), and where its threads are now."""
    log = url.log() if hasattr(url, "log") else ""
    lines = [line for line in log.splitlines() if "Error" in line or "Traceback" in line]
    last = log[log.rfind("Traceback"):][-4000:] if "Traceback" in log else ""
    stacks = f"\nthe app's threads:\n{url.stacks()}" if hasattr(url, "stacks") else ""
    said = "; server: " + " | ".join(lines[-6:]) + f"\nthe last traceback:\n{last}" if lines else ""
    return said + stacks


#: an init script (page.add_init_script) that lets a test break the page's heartbeat alone, as
#: a loaded machine or a network blip can: `window.plBreakHeartbeat()`. Gradio then ends the
#: session (its unload runs) while the page lives on with the same session and keeps acting.
HEARTBEAT_CUT = """(() => { const real = window.fetch; window.plHeartbeats = [];
  window.fetch = (input, opts) => {
    const url = typeof input === 'string' ? input : (input?.url ?? String(input));
    if (!url.includes('/heartbeat/')) return real(input, opts);
    const mine = new AbortController();
    (opts?.signal ?? input?.signal)?.addEventListener('abort', () => mine.abort());
    window.plHeartbeats.push(mine);
    return real(new Request(input, {...(opts ?? {}), signal: mine.signal})); };
  window.plBreakHeartbeat = () => window.plHeartbeats.forEach((c) => c.abort()); })();"""
ENDED = "ended (Gradio's unload)"  # what the app prints when Gradio ends a page's session


def break_heartbeat(pg: Any, app: Any, timeout_s: float = 60) -> None:
    """Break `pg`'s heartbeat (opened with HEARTBEAT_CUT) and wait until the served `app` (a
    ServedUrl) says Gradio ended the session."""
    ended = app.log().count(ENDED)
    assert pg.evaluate("() => window.plHeartbeats?.length ?? 0"), "the page has no heartbeat"
    pg.evaluate("() => window.plBreakHeartbeat()")
    deadline = time.monotonic() + timeout_s
    while app.log().count(ENDED) == ended:
        assert time.monotonic() < deadline, f"the session never ended: {app.log()[-2000:]}"
        time.sleep(0.1)


class QueueTraffic:
    """A page's Gradio queue traffic as Chromium sent it: its event streams (/queue/data) not yet
    ended, and every /queue request, join reply and stream end in the order they came. The
    server ends a page's stream once nothing of the page's is pending, so "a stream ended after
    the last join and none is open" says every answer has come, timer shown or not. Attach it
    before the page's first request.

    One exception, Gradio's client's (seen in CI): a join reply read after the stream that had
    already carried the answer ended makes the client open a stream for an answer it holds. The
    server has nothing of the page's to end it with, so it stays open until the page's next
    request, harmless to the page (that request's answer comes on it) but never "none open".
    `unstick` is that next request: pass it to `wait_until` as `meanwhile`."""

    QUIET_S = 2.0  # a stream open this long with no /queue traffic gets a nudge (unstick)

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.began = time.monotonic()
        self.open: dict[Any, float] = {}  # stream request -> when it began
        self.log: list[tuple[float, str, str]] = []  # (seconds from the start, kind, url's tail)
        self.nudges = 0  # presses of the page's nudge by `unstick`
        for kind in ("request", "requestfinished", "requestfailed"):
            pg.on(kind, lambda r, kind=kind: self._seen(kind, r))
        pg.on("response", lambda r: self._note("join", r.url) if "/queue/join" in r.url else None)

    def _note(self, kind: str, url: str) -> None:
        self.log.append((time.monotonic() - self.began, kind, url.split("/queue/")[-1][:40]))

    def _seen(self, kind: str, r: Any) -> None:
        if "/queue/" not in r.url:
            return
        self._note(kind, r.url)
        if "/queue/data" in r.url:
            if kind == "request":
                self.open[r] = time.monotonic()
            elif self.open.pop(r, None) is not None:
                self._note("end", r.url)

    def joins_since(self, mark: int) -> int:
        """Join replies since log entry `mark` (len(self.log) taken earlier)."""
        return sum(kind == "join" for _, kind, _ in self.log[mark:])

    def answered_since(self, mark: int) -> bool:
        """A join since `mark`, a stream ended after it, and none open: every answer came."""
        kinds = [kind for _, kind, _ in self.log[mark:]]
        return "join" in kinds and "end" in kinds[kinds.index("join"):] and not self.open

    def quiet_for(self) -> float:
        """Seconds since the last /queue traffic."""
        return time.monotonic() - self.began - (self.log[-1][0] if self.log else 0.0)

    def settled(self) -> bool:
        """No stream open and no /queue traffic for half a second (Playwright's "network idle"):
        a join reply still to be read could open a stream yet."""
        return not self.open and self.quiet_for() >= 0.5

    def unstick(self) -> None:
        """Press the page's nudge (ui/stream_nudge.py: a no-op request) when a stream has been
        open with no traffic for QUIET_S: the server ends the stream once its answer is sent.
        Where something was still running it costs one no-op."""
        if self.open and self.quiet_for() >= self.QUIET_S:
            self.nudges += 1
            self._note("nudge", "(by the test)")
            self.pg.evaluate("() => document.querySelector('#pl-nudge')?.click()")

    def report(self, last: int = 30) -> str:
        now = time.monotonic()
        return (f"streams open for {[round(now - t, 1) for t in self.open.values()]} s; last "
                "/queue traffic:\n" + "\n".join(f"{t:7.2f} {k} {u}" for t, k, u in self.log[-last:]))


def wait_until(pg: Any, done: Callable[[], bool], what: str, seconds: float = 120,
               detail: Callable[[], str] = lambda: "",
               meanwhile: Callable[[], None] = lambda: None) -> None:
    """Poll `done` (a Python condition fed by the page's events) while Playwright runs them,
    calling `meanwhile` between polls; a timeout says what did not happen, and `detail()` what
    the page was doing."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds} s\n{detail()}")
        meanwhile()
        pg.wait_for_timeout(50)
