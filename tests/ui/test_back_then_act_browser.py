"""Going back and trying something else, in the app on the default model, in Chromium (issue 40).

Acting after ◀ Back (Append, Fork, a serving Step), acting after Undo, and Show K/V at a past point
must work the way they do at the end of the log: the future is dropped, the act runs at the point
on screen, and no "Error" box appears. Each test has its own page (its own session) on one served
app. The page's answer is read from the status line ("operation k of n") and the toasts; a wait
never throws while the page renders (a missing element means "not yet")."""

from __future__ import annotations

import os

import pytest

from tests.ui.test_browser import CHROMIUM, WIDE, open_page

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                 reason="Debian's chromium is not installed (scripts/test.sh installs it)")]

# "ok" once the status line says `want` and the page is idle; "error: ..." as soon as a message
# box shows; null meanwhile (never throws while the page renders)
OUTCOME = """(want) => {
  const box = [...document.querySelectorAll('.toast-item')].find((t) => t.offsetParent !== null);
  if (box) return 'error: ' + box.innerText.replace(/\\s+/g, ' ');
  const busy = [...document.querySelectorAll('.progress-text')].some((e) => e.offsetParent !== null);
  const status = document.querySelector('#status')?.innerText ?? '';
  return !busy && status.includes(want) ? 'ok' : null;
}"""


def act(pg, selector: str, want: str) -> None:
    """Click `selector`; the status line must come to say `want`, with no message box."""
    pg.click(selector)
    outcome = pg.wait_for_function(OUTCOME, arg=want, timeout=120_000).json_value()
    assert outcome == "ok", f"{selector}: {outcome}"


@pytest.fixture()
def page(browser, served_app):
    pg = open_page(browser, served_app, WIDE)
    yield pg
    pg.close()


def test_append_and_fork_after_back_act_at_the_point_on_screen(page):
    act(page, "#new-seq", "operation 1 of 1")
    act(page, "#append", "operation 2 of 2")
    act(page, "#append", "operation 3 of 3")
    act(page, "#tl-back", "operation 2 of 3")
    act(page, "#tl-back", "operation 1 of 3")
    act(page, "#append", "operation 2 of 2")  # the future is dropped, as in an editor
    act(page, "#tl-back", "operation 1 of 2")
    act(page, "#fork", "operation 2 of 2")
    page.wait_for_function("() => document.querySelector('#event-log')?.innerText.includes('forked')",
                           timeout=60_000)
    assert page.console_errors == []


def test_undo_then_act(page):
    act(page, "#new-seq", "operation 1 of 1")
    act(page, "#append", "operation 2 of 2")
    act(page, "#append", "operation 3 of 3")
    act(page, "button:text-is('Undo')", "operation 2 of 2")
    act(page, "#append", "operation 3 of 3")
    act(page, "button:text-is('Undo')", "operation 2 of 2")
    act(page, "#fork", "operation 3 of 3")
    assert page.console_errors == []


def test_show_kv_at_a_past_point(page):
    act(page, "#new-seq", "operation 1 of 1")
    act(page, "#append", "operation 2 of 2")
    act(page, "#append", "operation 3 of 3")
    act(page, "#tl-back", "operation 2 of 3")
    act(page, "#tl-back", "operation 1 of 3")
    page.click("#inspector")  # the accordion opens on its label
    page.get_by_role("button", name="Show K/V").click()
    outcome = page.wait_for_function("""() => {
      const box = [...document.querySelectorAll('.toast-item')].find((t) => t.offsetParent !== null);
      if (box) return 'error: ' + box.innerText.replace(/\\s+/g, ' ');
      return document.querySelector('#kv-plot .main-svg') ? 'ok' : null; }""",
                                     timeout=120_000).json_value()
    assert outcome == "ok", outcome
    note = page.locator("#inspector-note").inner_text()
    assert "Block 0" in note and "held by seq 0" in note
    act(page, "#append", "operation 2 of 2")  # and acting after the read still works
    assert page.console_errors == []


def test_a_serving_step_after_back(page):
    page.get_by_role("tab", name="Serving").click()
    page.wait_for_selector("#add-request", timeout=60_000)
    act(page, "#add-request", "operation 1 of 1")
    act(page, "#serve-step", "operation 2 of 2")
    act(page, "#serve-step", "operation 3 of 3")
    act(page, "#tl-back", "operation 2 of 3")
    act(page, "#tl-back", "operation 1 of 3")
    act(page, "#serve-step", "operation 2 of 2")
    act(page, "#serve-step", "operation 3 of 3")
    assert page.console_errors == []
