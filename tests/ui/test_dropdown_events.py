"""The page's dropdowns as Gradio sends their events: a dropdown sends `input` at every blur, its
value unchanged, beside whatever the click that blurred it started; either event can be answered
last. An event that changes nothing must draw nothing, or a stale picture lands last.

A lesson page's input (a dropdown under its question): a clicker's arrow from the open box blurs
it as it presses Next. So it listens to a pick (`select`), not to `input`; a pick is read against
the page it was made on (it can race a page turn too), and one that changes nothing draws nothing
(its answer, landing after Next's, would show the page before again). A dry lesson
(07_fragmentation, page 4: `num_gpu_blocks`) through the app's own handler, with the progress
line as the browser sends it back (Gradio's Markdown, out and in). The race itself in Chromium:
tests/ui/test_presenter_browser.py. The Playground's sequence box keeps `input` (its value feeds
Append, Fork and Free): a blur's event draws nothing there. Play's timer races Pause the same
way: a tick answered after Pause must not switch the timer on again.
"""

from __future__ import annotations

import gradio as gr
import pytest

from engine import EngineConfig, ops
from lessons import LessonRun, load_all
from ui.lesson_pages import LessonSession, progress_line
from ui.session import Session

DRY = "dry (bookkeeping only, no model)"


@pytest.fixture(scope="module")
def fns() -> dict:
    """The app's handlers by name, with their inputs (a dry build; the first of a name)."""
    from ui.app import build_app

    out: dict = {}
    for f in build_app(DRY).fns.values():
        out.setdefault(f.name, f)
    return out


@pytest.fixture(scope="module")
def first_input(fns):
    """The app's handler of a lesson page's first input."""
    return fns["on_lesson_input"]


def _on_page_4() -> tuple[LessonSession, Session]:
    ls = LessonSession()
    ls.play(LessonRun(next(x for x in load_all() if x.name == "07_fragmentation")))
    ls.run.goto(3)
    session = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    session.front = ls
    return ls, session


def _sent(fn, ls: LessonSession) -> str:
    """The progress line of the page on screen as the browser sends it back with an event."""
    box = next(c for c in fn.inputs if isinstance(c, gr.Markdown))
    return box.preprocess(box.postprocess(progress_line(ls)))


def _skipped(out: tuple) -> bool:
    return all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1 for v in out)


def _picked(value: str) -> gr.SelectData:
    return gr.SelectData(None, {"index": 0, "value": value, "selected": True})


def test_a_pick_that_changes_nothing_draws_nothing(first_input):
    ls, session = _on_page_4()
    run, shown = ls.run, _sent(first_input, ls)
    assert "page 4 of 4" in shown
    out = first_input.fn(ls, session, shown, _picked(str(run.params["num_gpu_blocks"])))
    assert _skipped(out) and ls.run is run


def test_a_pick_made_before_a_page_turn_is_kept_on_the_page_after(first_input):
    """Picked on page 4, handled after Back: the lesson plays again with it, to page 3."""
    ls, session = _on_page_4()
    shown = _sent(first_input, ls)
    ls.run.back()
    out = first_input.fn(ls, session, shown, _picked("1024"))
    assert ls.run.params["num_gpu_blocks"] == 1024 and "page 3 of 4" in out[1]


def test_a_pick_from_another_lessons_page_changes_nothing(first_input):
    ls, session = _on_page_4()
    run = ls.run
    out = first_input.fn(ls, session, "**1. The KV cache and its cost**: page 4 of 5", _picked("1024"))
    assert _skipped(out) and ls.run is run and run.params["num_gpu_blocks"] != 1024


def test_a_real_pick_plays_the_lesson_again_with_it(first_input):
    ls, session = _on_page_4()
    before = ls.run
    out = first_input.fn(ls, session, _sent(first_input, ls), _picked("1024"))
    assert ls.run is not before and ls.run.params["num_gpu_blocks"] == 1024
    assert out[0] is ls and "page 4 of 4" in out[1]  # the same page, played with the new value
    with pytest.raises(gr.Error, match="one of"):  # a value the page does not offer
        first_input.fn(ls, session, _sent(first_input, ls), _picked("3"))
    assert ls.run.params["num_gpu_blocks"] == 1024


def test_a_blur_of_the_playgrounds_sequence_box_draws_nothing(fns):
    session = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))
    session.run(ops.AddSequence("abcdef"))
    session.run(ops.Fork(0))
    choose = fns["on_choose"].fn
    assert not _skipped(choose("0", session)) and session.selected_seq == 0  # a pick draws
    assert _skipped(choose("0", session)) and session.selected_seq == 0  # its blur does not
    assert not _skipped(choose("1", session)) and session.selected_seq == 1


def test_a_play_tick_leaves_the_timer_as_it_is(fns):
    """Play's timer: a tick that moves on must not switch the timer on again. Pause switches
    it off; a tick already on its way (seconds on a loaded machine) would otherwise land after
    Pause and start the replay again (a loaded run's test_play_replays_the_log_and_pause_stops_it
    saw the log move on after Pause)."""
    session = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))
    session.run(ops.AddSequence("abcdef"))
    session.run(ops.Fork(0))
    session.goto(1)
    tick = fns["on_tick"].fn
    timer, *_ = tick(session)
    assert session.pos == 2 and _skipped((timer,))
    timer, *_ = tick(session)  # at the end of the log: the replay stops itself
    assert isinstance(timer, gr.Timer) and timer.active is False
