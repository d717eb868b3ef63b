"""The vLLM tab keeps watching, and the picture shows the tab in front, whatever order the page's
tab events reach the server in and their answers come back in.

With `--vllm-events` every page opens on the vLLM tab: the load's chain puts the tab in front,
and Gradio also sends, unqueued, the select of the tab the page mounted on (the Playground), which
tells the tab's timer to rest. On a loaded machine that select can be handled after the chain
(a clean-clone run saw the tab stay on "connecting to ..." for 120 s). Here Chromium holds that
request until the tab is in front and only then lets it go: the tab must still poll its watch,
which says within its silence time that nothing answers at the endpoint.

(Which picture shows is the page's own business, whatever the answers' order:
tests/ui/test_vllm_view.py.)

A dry app (no model) and an endpoint where nothing listens: no vLLM is needed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.conftest import ServedUrl, serve_app
from tests.ui.test_browser import CHROMIUM
from ui.app_process import free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="Debian's chromium is not installed (scripts/test.sh installs it)")]

NOTE = "(document.querySelector('#vllm-note')?.innerText ?? '')"
# the tab is in front: its picture shows and its note says it is connecting (never throws)
IN_FRONT = ("() => { const p = document.querySelector('#vllm-picture'); "
            f"return !!p && p.offsetParent !== null && {NOTE}.startsWith('connecting'); }}")


@pytest.fixture(scope="module")
def app_url() -> Iterator[ServedUrl]:
    yield from serve_app(argv=("app.py", "--dry", "--vllm-events", f"tcp://127.0.0.1:{free_port()}"),
                         timeout=300)


def _selects(request, tab: str) -> bool:
    """Whether `request` is the page's select of `tab` (a tab's select names it)."""
    try:
        event = json.loads(request.post_data or "{}").get("event_data") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(event, dict) and event.get("value") == tab


def test_a_late_select_of_the_mount_tab_does_not_stop_the_watch(app_url, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    held = []
    page.route("**/gradio_api/run/predict*",
               lambda route: held.append(route) if _selects(route.request, "Playground")
               else route.continue_())
    try:
        page.goto(app_url)
        page.wait_for_function(IN_FRONT, timeout=120_000)
        assert held, "the page never sent its mount tab's select: this test no longer tests it"
        for route in held:  # the off-event now reaches the server after the tab came in front
            route.continue_()
        page.wait_for_function(f"() => {NOTE}.includes('nothing answered')", timeout=60_000)
        assert page.evaluate("() => document.querySelector('#vllm-picture').offsetParent !== null")
    except Exception as err:
        raise AssertionError(f"the tab says {page.evaluate(f'() => {NOTE}')!r}; "
                             f"held {len(held)} select(s)\n{app_url.log()[-3000:]}") from err
    finally:
        page.close()


# the session's picture, shown, at its column's width (null while the page renders)
FITTED = """() => { const c = document.querySelector('#pool-plot');
  const p = c?.querySelector('.js-plotly-plot'); const w = p?._fullLayout?.width;
  if (!c || !w || c.offsetParent === null) return null;
  return Math.abs(w - c.getBoundingClientRect().width) <= 2 ? w : null; }"""


def test_the_sessions_picture_fits_a_phone_when_the_page_leaves_the_vllm_tab(app_url, browser):
    """The page opens on the vLLM tab (`--vllm-events`), so the session's picture is drawn while
    hidden, at Plotly's default width; on the Playground it must fit the phone's column."""
    page = browser.new_page(viewport={"width": 390, "height": 844})
    try:
        page.goto(app_url)
        page.wait_for_function(IN_FRONT, timeout=120_000)
        page.get_by_role("tab", name="Playground").click()
        try:
            page.wait_for_function(FITTED, timeout=30_000)
        except Exception as err:
            raise AssertionError("the session's picture does not fit the column: " + str(
                page.evaluate("() => { const p = document.querySelector('#pool-plot .js-plotly-plot');"
                              " return [p?._fullLayout?.width, p?.getBoundingClientRect().width]; }")
            )) from err
    finally:
        page.close()
