"""The app's vLLM tab in Chromium against the real vLLM server of this folder (no mock): the app
is started with `--vllm-events` (its page opens on the tab, watching), a prompt typed in the tab
goes to vLLM's OpenAI API, and the picture and counts follow vLLM's KV events; on a phone, an
endpoint where nothing answers is named while the picture keeps vLLM's cache, "Start one
here" finds the lab's vLLM (this folder's server) instead of starting another, and a page whose
session Gradio ended while it lived (its heartbeat alone broke) watches vLLM again.

The app runs in dry mode: the tab draws vLLM's cache, not PagedLab's, so it needs no model of
its own (and the app starts in seconds, not the model's load time, on a busy 2-core machine).
Every wait is for a condition in the page, written so that it cannot throw while Gradio renders.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import ServedUrl, serve_app
from tests.helpers import HEARTBEAT_CUT, QueueTraffic, break_heartbeat, server_errors
from tests.vllm.conftest import settle
from ui.app_process import free_port

pytestmark = pytest.mark.slow

#: what the tree's figure says it holds (ui/vllm_panel.py puts it in the layout's meta)
META = ("(() => { const p = document.querySelector('#vllm-tree .js-plotly-plot'); "
        "return (p && p.layout && p.layout.meta && p.layout.meta.vllm) || null; })()")
NOTE = "(document.querySelector('#vllm-note')?.innerText ?? '')"


#: the tab in front, as the vLLM tab's tick reads it (never throws)
SELECTED = ("(document.querySelector('#controls-col [role=tab][aria-selected=true], "
            "#controls-col [role=tab].selected')?.innerText ?? '').trim()")


def until_said(page, text: str, timeout_ms: int, app: ServedUrl | None = None,
               traffic: QueueTraffic | None = None) -> None:
    """Wait for the tab's note to say `text`; if it never does, fail with what it says, the
    tab in front, the page's queue traffic (did the ticks' answers come?) and what the app
    printed. (A loaded full run once saw 'connecting to ...' for 120 s while ticks ran.)"""
    try:
        page.wait_for_function(f"() => {NOTE}.includes({text!r})", timeout=timeout_ms)
    except Exception as err:  # Playwright's timeout: say what the tab said instead
        raise AssertionError(f"the tab never said {text!r}; it says "
                             f"{page.evaluate(f'() => {NOTE}')!r}, with "
                             f"{page.evaluate(f'() => {SELECTED}')!r} in front; "
                             f"{traffic.report() if traffic else ''}\nthe app printed:\n"
                             f"{app.log()[-3000:] if app else ''}{server_errors(app)}") from err


@pytest.fixture(scope="module")
def vllm_app(vllm_server) -> Iterator[ServedUrl]:
    yield from serve_app(argv=("app.py", "--dry", "--vllm-events", vllm_server.events_endpoint,
                               "--vllm-replay", vllm_server.replay_endpoint, "--vllm-url",
                               vllm_server.url), timeout=300)


def test_a_prompt_sent_from_the_tab_redraws_vllms_cache(vllm_app, vllm_server, vllm_watch,
                                                        browser):
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    traffic = QueueTraffic(page)
    try:
        page.goto(vllm_app)
        until_said(page, "Watching", 120_000, vllm_app, traffic)
        assert "physical block ids, block tables or reference counts" in page.inner_text(
            "#vllm-intro")
        settle(vllm_watch)
        before = page.evaluate(f"() => {META}") or {"seq": -1}
        page.fill("#vllm-prompt textarea", "Name three rivers of Europe, briefly.")
        page.click("#vllm-send")
        page.wait_for_function(
            "() => document.querySelector('.vllm-sent[data-status=done]') !== null",
            timeout=120_000)
        settle(vllm_watch)  # the test's own watch of the same server: what the page must show
        want_seq, want_blocks = vllm_watch.last_seq, len(vllm_watch.tree().nodes)
        assert want_seq > before["seq"]
        page.wait_for_function(
            f"() => {{ const m = {META}; return !!m && m.seq >= {want_seq}; }}", timeout=30_000)
        meta = page.evaluate(f"() => {META}")
        assert meta["blocks"] == want_blocks > 0
        counts = page.inner_text("#vllm-counts")
        assert f"{want_blocks} blocks in vLLM's prefix cache now" in counts
        assert "prompt tokens were cached in vLLM" in page.inner_text("#vllm-sent")
    finally:
        page.close()


def test_start_one_here_finds_the_labs_vllm_on_a_phone(vllm_app, browser):
    page = browser.new_page(viewport={"width": 390, "height": 844})
    page.add_init_script(HEARTBEAT_CUT)
    traffic = QueueTraffic(page)
    try:
        page.goto(vllm_app)
        until_said(page, "Watching", 120_000, vllm_app, traffic)
        # an endpoint where nothing answers: said in the tab, the picture keeps vLLM's cache
        page.fill("#vllm-events textarea, #vllm-events input", f"tcp://127.0.0.1:{free_port()}")
        page.click("#vllm-connect")
        until_said(page, "nothing answered", 60_000, vllm_app, traffic)
        assert "still shows" in page.evaluate(f"() => {NOTE}")
        page.click("#vllm-start")
        until_said(page, "Watching", 60_000, vllm_app, traffic)
        page.wait_for_function(f"() => {{ const m = {META}; return !!m; }}", timeout=30_000)
        # the heartbeat breaks alone (a loaded machine): Gradio ends the session, its unload
        # closes the watch, and the page lives on with that session: it watches vLLM again, a
        # new subscription that redraws the cache from the replay (CI: "connecting…" for good)
        back = time.time()
        break_heartbeat(page, vllm_app)
        page.wait_for_function(f"(t) => {{ const m = {META}; return !!m && m.watch_opened_at > t; }}",
                               arg=back, timeout=60_000)
        until_said(page, "Watching", 30_000, vllm_app, traffic)
    finally:
        page.close()
