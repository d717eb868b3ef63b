"""Issue 23's small things a user notices: the status line names the model, over-long and
fractional input is refused with a message naming the field, a refused input is one log line,
the inspector follows its block's state."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest

from engine import EngineConfig, ops
from tests.helpers import fingerprint
from ui import limits
from ui.render import render
from ui.session import Session
from ui.stream_nudge import NUDGE_ID


def _status(config: EngineConfig) -> str:
    s = Session(config)
    s.run(ops.AddSequence("Four score"))
    return render(s)[-1]


def test_status_line_names_the_default_model(default_model) -> None:
    status = _status(EngineConfig(model="default", block_size=16, num_gpu_blocks=8,
                                  device="cpu", dtype="float32"))
    assert status.startswith("model: SmolLM2-135M-Instruct · ")
    assert "default" not in status


def test_status_line_names_the_tiny_model_and_the_dry_mode(tiny_model) -> None:
    status = _status(EngineConfig(model="tiny-random", block_size=4, num_gpu_blocks=8,
                                  device="cpu", dtype="float32"))
    assert status == "model: tiny random Llama · operation 1 of 1"
    assert _status(EngineConfig(model=None, block_size=4, num_gpu_blocks=8)) == (
        "dry mode: bookkeeping only, no model · operation 1 of 1")


def test_status_line_names_any_other_model_as_given() -> None:
    from ui.render import model_status

    cfg = EngineConfig(model="HuggingFaceTB/SmolLM2-360M-Instruct", block_size=4, num_gpu_blocks=8)
    assert model_status(cfg) == "model: HuggingFaceTB/SmolLM2-360M-Instruct"
    tp = EngineConfig(model="default", tensor_parallel_size=3, block_size=4, num_gpu_blocks=8)
    assert model_status(tp) == "model: SmolLM2-135M-Instruct on 3 ranks"




# ---- input as Gradio hands it over: each box's own preprocess, then the app's handler ----------

DRY = "dry (bookkeeping only, no model)"


@pytest.fixture(scope="module")
def app_demo():
    """The app's page, built dry (no model)."""
    from ui.app import build_app

    return build_app(DRY)


@pytest.fixture(scope="module")
def app_fns(app_demo) -> dict:
    """The app's click handlers by name with the components that feed them (a dry build)."""
    return {f.name: f for f in app_demo.fns.values() if f.name.startswith("on_") or f.name == "compare"}


def _click(fn, values: tuple, session: Session):
    """What a click does: every number and text box preprocesses its value (Gradio's rounding,
    bounds and such run here; a dropdown's choices are the page's, set at run time, so its value
    goes as it is), then the handler runs on the session."""
    boxes = [c for c in fn.inputs if not isinstance(c, gr.State)]
    assert len(boxes) == len(values), [type(c).__name__ for c in boxes]
    args = [c.preprocess(v) if isinstance(c, (gr.Number, gr.Textbox)) else v
            for c, v in zip(boxes, values, strict=True)]
    return fn.fn(*args, session)


def _dry_session() -> Session:
    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=32))
    s.run(ops.AddSequence("abcdef"))
    return s


def _refused(fn, values: tuple, message: str) -> None:
    s = _dry_session()
    before, log = fingerprint(s.engine), list(s.ops)
    with pytest.raises(gr.Error) as err:
        _click(fn, values, s)
    assert message in str(err.value.message), err.value.message
    assert s.ops == log and fingerprint(s.engine) == before  # nothing changed


def test_an_over_long_prompt_is_refused_whole_not_cut(app_fns) -> None:
    for name in ("on_new", "on_add_request"):
        prompt = next(c for c in app_fns[name].inputs if isinstance(c, gr.Textbox))
        assert prompt.max_length is None  # the browser would cut a paste without a word
    _refused(app_fns["on_new"], ("x" * 5000, False),
             "prompt is 5,000 characters; the most is 4,000")
    _refused(app_fns["on_add_request"], ("x" * 5000, 1, 1, 16, 0.0),
             "request prompt is 5,000 characters; the most is 4,000")


@pytest.mark.parametrize(("name", "values", "message"), [
    ("on_append", ("0", 2.5), "tokens must be a whole number"),
    ("on_append", ("0", 0), "tokens must be a whole number from 1"),
    ("on_append", ("0", 100000), "tokens must be a whole number from 1 to"),
    ("on_add_request", ("hi", 2.5, 1, 16, 0.0), "n samples must be a whole number"),
    ("on_add_request", ("hi", 0, 1, 16, 0.0), "n samples must be a whole number from 1"),
    ("on_add_request", ("hi", 1, 2.5, 16, 0.0), "beam width must be a whole number"),
    ("on_add_request", ("hi", 1, 1, 2.5, 0.0), "max tokens must be a whole number"),
    ("on_add_request", ("hi", 1, 1, 0, 0.0), "max tokens must be a whole number from 1"),
    ("on_add_request", ("hi", 1, 1, 16, -1), "temperature must be a number from 0"),
], ids=lambda v: str(v))
def test_a_bad_count_names_its_field_through_gradio(app_fns, name, values, message) -> None:
    """Gradio's own checks (precision=0 rounding 2.5 to 2, "Value 0 is less than minimum value 1")
    would answer first without naming the field: the boxes leave the check to the handler."""
    _refused(app_fns[name], values, message)


def test_no_number_box_lets_gradio_answer_first(app_fns) -> None:
    """Every number box of every page (Playground, Serving, Compare, the classroom's teacher
    page) has no Gradio bounds or precision, so its handler's message names the field."""
    boxes = {c for f in app_fns.values() for c in f.inputs if isinstance(c, gr.Number)}
    labels = {b.label for b in boxes}
    assert {"tokens", "requests", "pool size (blocks)", "blocks for the class"} <= labels, labels
    for box in boxes:
        assert (box.minimum, box.maximum, box.precision) == (None, None, None), box.label


@pytest.mark.parametrize(("values", "message"), [
    ((0, 2048, 32768, 16, 0), "requests must be a whole number from 1 to 10000"),
    ((2.5, 2048, 32768, 16, 0), "requests must be a whole number"),
    ((200, 4, 32768, 16, 0), "max length must be a whole number from 8 to 65536"),
    ((200, 2048, 8, 16, 0), "pool (token slots) must be a whole number from 16 to"),
    ((200, 2048, 32768, 16, -1), "seed must be a whole number from 0"),
], ids=lambda v: str(v))
def test_compare_names_the_field_it_refuses(app_fns, values, message) -> None:
    with pytest.raises(gr.Error) as err:
        app_fns["compare"].fn(*values)
    assert message in err.value.message


def test_a_whole_count_from_a_float_box_still_works(app_fns) -> None:
    s = _dry_session()
    out = _click(app_fns["on_append"], ("0", 3.0), s)
    assert out[-1].endswith("operation 2 of 2") and s.ops[-1] == {"op": "append", "seq": 0, "n": 3}


# ---- a refused input is one log line; a bug keeps its traceback ----------------------------------

def test_a_refused_input_is_logged_as_one_line(app_fns, capfd) -> None:
    s = _dry_session()
    capfd.readouterr()
    with pytest.raises(gr.Error) as err:
        _click(app_fns["on_append"], ("0", 2.5), s)
    assert err.value.print_exception is False  # Gradio's queue would print its traceback
    logged = capfd.readouterr().err
    assert logged == f"[pagedlab] refused on_append: tokens must be a whole number from 1 to " \
                     f"{limits.MAX_APPEND}\n"
    with pytest.raises(gr.Error):
        _click(app_fns["on_new"], ("line one\x00", False), s)
    assert capfd.readouterr().err.count("\n") == 1


def test_an_unexpected_error_keeps_its_traceback(app_fns, capfd, monkeypatch) -> None:
    s = _dry_session()
    monkeypatch.setattr("ui.front.render", lambda session: 1 / 0)  # a bug in drawing
    capfd.readouterr()
    with pytest.raises(gr.Error, match=r"something went wrong \(ZeroDivisionError\)"):
        _click(app_fns["on_append"], ("0", 1), s)
    logged = capfd.readouterr().err
    assert "Traceback (most recent call last)" in logged and "ZeroDivisionError" in logged
    assert "refused" not in logged


@pytest.mark.slow
def test_the_served_app_logs_refused_input_in_one_line_each() -> None:
    """Through Gradio's queue (which prints a traceback for every error it is not told to keep
    quiet about): three refused clicks leave three lines in the server's output, no traceback."""
    from gradio_client import Client

    from ui.app_process import free_port, launch, stop

    port = free_port()
    proc = launch(["app.py", "--dry"], port)
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False)
        c.predict("abcdef", False, api_name="/on_new")
        for args, api in [(("0", 2.5), "/on_append"), (("0", 0), "/on_append"),
                          (("x" * 5000, False), "/on_new")]:
            with pytest.raises(Exception, match="tokens must be a whole number|prompt is 5,000"):
                c.predict(*args, api_name=api)
    finally:
        out = stop(proc)
    assert "Traceback" not in out, out[-3000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("[pagedlab] refused")]
    assert lines == [
        f"[pagedlab] refused on_append: tokens must be a whole number from 1 to {limits.MAX_APPEND}",
        f"[pagedlab] refused on_append: tokens must be a whole number from 1 to {limits.MAX_APPEND}",
        "[pagedlab] refused on_new: prompt is 5,000 characters; the most is 4,000",
    ], out[-3000:]


# ---- the inspector follows its block -------------------------------------------------------------

def test_the_inspector_is_rewritten_whenever_the_status_line_changes(app_fns) -> None:
    """Every operation, Back, Next and the timeline rewrite the status line ("operation k of n"):
    ui/motion.js then presses the hidden follow button, whose click rewrites the inspector's note
    and K/V figure. Not the status Markdown's own change event (Gradio fires it again without a
    change) nor the picture's (it fires whenever Plotly redraws): either kept the page calling the
    server in a loop."""
    status = app_fns["on_new"].outputs[-1]
    assert "status" in (status.elem_id or "")
    follow = app_fns["on_follow"]
    assert [event for _, event in follow.targets] == ["click"]
    script = (Path(__file__).parents[2] / "ui" / "motion.js").read_text()
    assert "#status .prose" in script and "#pl-follow" in script
    click_outputs = app_fns["on_click"].outputs
    note = next(c for c in click_outputs if getattr(c, "elem_id", None) == "inspector-note")
    assert note in follow.outputs


def test_the_inspector_describes_a_freed_block_as_free_or_cached(app_fns) -> None:
    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    a = s.run(ops.AddSequence("abcdef"))  # block 0 full (hashed), block 1 partly filled
    out = app_fns["on_click"].fn("block:0|1", s)
    assert "**Block 0**: used, ref count 1, held by seq 0" in out[-3]
    s.selected_block = 1
    on_follow = app_fns["on_follow"]  # every follower of the status line in one event
    at = next(i for i, c in enumerate(on_follow.outputs) if getattr(c, "elem_id", None) == "inspector-note")

    def follow(layer, session):  # the inspector's note and K/V figure, as one follow sends them
        out = on_follow.fn(layer, session, None)  # the layer, the session, the rank (all)
        return out[at], out[at + 1]

    note, _ = follow(0, s)
    assert note.startswith("**Block 1**: used, ref count 1, held by seq 0")
    s.run(ops.Free(a))
    note, figure = follow(0, s)
    assert note.startswith("**Block 1**: free: no sequence holds it (ref count 0)")
    assert "seq 0" not in note and figure is None  # dry: no K/V to draw
    s.selected_block = 0
    note, _ = follow(0, s)
    assert note.startswith("**Block 0**: cached: no sequence holds it (ref count 0)")
    assert "is evicted: `abcd`" in note and "seq 0" not in note


@pytest.mark.slow
def test_the_shards_picture_follows_a_tensor_parallel_session(tmp_path, monkeypatch) -> None:
    """The shards picture draws a tensor-parallel session's view, hides behind a lesson without
    tensor parallelism and comes back after it."""
    from engine.tp.models import TINY_KV2, save_random_llama
    from ui import tp_panel

    path = str(save_random_llama(tmp_path / "kv2", TINY_KV2))
    monkeypatch.setattr(limits, "ALLOWED_MODELS", (*limits.ALLOWED_MODELS, path))  # as --model
    monkeypatch.setattr(limits, "TP_SIZES", (1, 2))  # two workers start faster than three
    s = Session(EngineConfig(model=path, tensor_parallel_size=2, block_size=4, num_gpu_blocks=8,
                             device="cpu", dtype="float32"))
    try:
        s.run(ops.AddSequence("abcdef"))
        first = tp_panel.shards_update(s)
        assert first["visible"] is True and "2 pools" in first["value"].layout.title.text
        from ui.lesson_pages import LessonSession

        s.front = LessonSession()  # a lesson (not started) in front: hidden
        assert tp_panel.shards_update(s)["visible"] is False
        s.front = s
        shown = tp_panel.shards_update(s)
        assert shown["visible"] is True and shown["value"] is not None
    finally:
        s.close()


def test_a_follower_that_fails_leaves_the_others_to_answer(app_fns, monkeypatch) -> None:
    """The followers answer in one event (ui/page.wire_follow): one that raises skips its own
    outputs, and the others' values still come, each in its place."""
    from ui import tp_panel

    on_follow = app_fns["on_follow"]
    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    s.run(ops.AddSequence("abcdef"))
    s.selected_block = 0
    at = next(i for i, c in enumerate(on_follow.outputs) if getattr(c, "elem_id", None) == "inspector-note")
    monkeypatch.setattr(tp_panel, "front", lambda _s: 1 / 0)  # the shards' follower now raises
    out = on_follow.fn(0, s, None)
    assert len(out) == len(on_follow.outputs)
    assert str(out[at]).startswith("**Block 0**")  # the inspector still answered
    assert isinstance(out[-1], type(gr.skip()))  # the shards' output (the last follower) skipped


def test_a_run_moved_while_the_view_is_drawn_is_drawn_again(app_fns, monkeypatch) -> None:
    """Next's event runs beside the follow event of the page before it: a view drawn while the
    run moved must not count as the new page's view, or the next follow skips it and the view
    under the picture stays the old page's (a slide walk found it: never drawn for the slide)."""
    from ui.front import SessionFront

    on_follow = app_fns["on_follow"]
    at = next(i for i, c in enumerate(on_follow.outputs) if getattr(c, "elem_id", None) == "view-plot")
    s = Session(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))
    s.run(ops.AddSequence("abcdef"))
    s.view_choice, s.box = "timeline", (900, 0)  # a page's column 900 px wide
    drawn = SessionFront.view_figure

    def drawn_while_the_run_moves(self):
        fig = drawn(self)
        self.session.run(ops.AddSequence("ghij"))  # the other event's operation, mid-draw
        return fig

    monkeypatch.setattr(SessionFront, "view_figure", drawn_while_the_run_moves)
    assert on_follow.fn(0, s, None)[at]["value"] is not None
    monkeypatch.setattr(SessionFront, "view_figure", drawn)
    again = on_follow.fn(0, s, None)[at]  # the status line changed: the new run's view comes
    assert isinstance(again, dict) and again.get("__type__") == "update" and again["value"] is not None
    assert on_follow.fn(0, s, None)[at] == gr.skip()  # and once drawn, it is not drawn again


def test_the_page_scripts_clicks_are_never_dropped(app_demo) -> None:
    """The page's script presses hidden buttons (the status line changed, the picture's box, a
    click on the picture or the view): Gradio drops a button's click while its last event is
    pending ("once"), which left the view under the picture on the page before when Next came
    during its follow. Each runs the last click after the pending one instead. The nudge
    (ui/stream_nudge.py) is the one exception: it runs every press, since it exists for the case
    where the press before it is lost, and "always_last" would wait for that one for ever."""
    hidden = {bid for bid, b in app_demo.blocks.items()
              if isinstance(b, gr.Button) and "pl-hidden" in (b.elem_classes or [])}
    fired = [f for f in app_demo.fns.values() if any(bid in hidden for bid, _ in f.targets)]
    nudge = [f for f in fired if any(app_demo.blocks[bid].elem_id == NUDGE_ID for bid, _ in f.targets)]
    assert [f.trigger_mode for f in nudge] == ["multiple"] * 3  # the main page and both room pages
    fired = [f for f in fired if f not in nudge]
    assert {f.name for f in fired} >= {"on_follow", "on_box", "on_view_box", "on_click", "on_view_click"}
    assert {f.name: f.trigger_mode for f in fired} == {f.name: "always_last" for f in fired}


def test_the_tab_clock_admits_the_latest_event_only() -> None:
    """Tab events reach the server, and their answers the page, in any order (ui/tab_clock.py;
    in Chromium: tests/ui/test_tab_order_browser.py)."""
    from ui.tab_clock import TabClock

    clock = TabClock()
    assert clock.admit(100.0) and clock.still_latest(100.0)
    assert clock.admit(250.0) and not clock.still_latest(100.0)  # overtaken while answered
    assert not clock.admit(200.0) and clock.latest == 250.0  # sent before, arriving after
    assert clock.admit(None) and clock.still_latest(None)  # an API call: no clock
