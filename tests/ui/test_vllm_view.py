"""The vLLM tab's watch (ui/vllm_view.py) and what the tab draws of it (ui/vllm_panel.py), with
bad input from a publisher in the test process that speaks vLLM's protocol (the happy path
against a real vLLM, in Chromium: tests/vllm/test_watch_tab_browser.py): an address that is not
one, an endpoint that does not answer, frames of another schema and a gap each get a sentence in
the tab's note, and the picture keeps what it had."""

from __future__ import annotations

import socket
import threading
import time

import gradio as gr
import pytest

from engine.vllm import link
from engine.vllm.server import free_port
from tests.engine.vllm.publisher import Publisher, stored
from ui import vllm_view
from ui.limits import UserError
from ui.vllm_panel import NOTE_RESEND_S, _values, note_text
from ui.vllm_view import VllmView


@pytest.fixture
def pub():
    p = Publisher(replay=False)
    yield p
    p.close()


class _Look:  # what _values reads of a session: the picture's box and presenter mode
    box = None
    presenter = False


def until(view: VllmView, done, most_s: float = 8.0) -> None:
    deadline = time.monotonic() + most_s
    while not done() and time.monotonic() < deadline:
        view.poll(0.05)
    assert done(), note_text(view)


def watching(pub: Publisher) -> VllmView:
    """A view that has joined `pub` and drawn two blocks."""
    view = VllmView()
    view.connect(pub.endpoint)
    until(view, lambda: view.watch.joined)
    time.sleep(0.2)  # the subscription reaches the PUB
    pub.publish(stored([11, 12], None))
    until(view, lambda: view.watch.mirror.batches == 1)
    tree, *_ = _values(view, _Look, True)
    assert tree.layout.meta["vllm"]["blocks"] == 2
    return view


def blocks(view: VllmView) -> int:
    return len(view.watch.tree().nodes)


def test_a_bad_address_is_refused_and_the_watch_stays(pub):
    view = watching(pub)
    try:
        for bad in ("", "localhost:5557", "http://127.0.0.1:8000", "tcp://h:99999"):
            with pytest.raises(UserError):
                view.connect(bad)
        assert view.watch.endpoint == pub.endpoint and blocks(view) == 2
    finally:
        view.close()


def test_an_endpoint_that_does_not_answer_keeps_the_picture(pub, monkeypatch):
    monkeypatch.setattr(vllm_view, "SILENCE_S", 0.5)
    view = watching(pub)
    try:
        view.connect(f"tcp://127.0.0.1:{free_port()}")
        until(view, lambda: view.pending is None)
        said = note_text(view)
        assert "nothing answered" in said and "still shows" in said, said
        assert view.watch.endpoint == pub.endpoint and blocks(view) == 2
        tree, *_ = _values(view, _Look, False)
        assert tree == gr.skip() or tree.layout.meta["vllm"]["blocks"] == 2
    finally:
        view.close()


def test_another_schema_and_a_gap_are_said_and_the_tree_kept(pub):
    view = watching(pub)
    try:
        pub.send_raw([b"", (1).to_bytes(8, "big"), b"\x93not msgpack"])
        until(view, lambda: view.watch.problems)
        assert "skipped" in note_text(view) and blocks(view) == 2
        pub.seq = 2
        pub.publish(stored([13], 12), drop=True)  # message 2 lost, no replay endpoint
        pub.publish(stored([14], 12))
        until(view, lambda: view.watch.mirror.batches == 2)
        said = note_text(view)
        assert "message 2" in said and "never arrived" in said, said
        assert blocks(view) == 3  # what came is drawn; what was lost is named
    finally:
        view.close()


def test_a_prompt_needs_an_api_and_text():
    view = VllmView()
    with pytest.raises(UserError, match="type a prompt"):
        view.send("  ")
    with pytest.raises(UserError, match="no OpenAI API"):
        view.send("hello")
    assert "Start one here" in note_text(view)


def test_start_one_here_without_vllm_says_why(monkeypatch):
    from engine.vllm import lab

    monkeypatch.delenv(lab.ENV, raising=False)
    monkeypatch.setenv("PAGEDLAB_VLLM_PYTHON", "/no/such/python")
    view = VllmView()
    try:
        view.start_here()
        view.poll()
        said = note_text(view)
        assert "could not start vLLM here" in said and "/no/such/python" in said, said
        assert view.watch is None
    finally:
        view.close()
        lab.forget_failure()


class LateGreeting:
    """A TCP relay to `endpoint` that takes connections at once but passes no byte either way
    until `greet()`: a vLLM whose ZMQ greeting comes late (a loaded machine)."""

    def __init__(self, endpoint: str) -> None:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.go = threading.Event()
        self.links: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def greet(self) -> None:
        self.go.set()

    def _accept(self) -> None:
        peer, _ = self.listener.accept()
        self.go.wait()
        upstream = socket.create_connection(self.target)
        self.links = [peer, upstream]
        for a, b in ((peer, upstream), (upstream, peer)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for s in (self.listener, *self.links):
            s.close()


def test_a_greeting_that_comes_late_is_watching_not_a_problem(pub, monkeypatch):
    """A peer silent past GREETING_S is said not to speak ZMQ; when its greeting comes after
    all (vLLM on a loaded machine), the tab says it is watching, not the problem (issue: the
    note kept 'does not speak ZMQ' under a suite's load, and the page never said Watching)."""
    monkeypatch.setattr(link, "GREETING_S", 0.3)
    relay = LateGreeting(pub.endpoint)
    view = VllmView()
    try:
        view.connect(relay.endpoint)
        until(view, lambda: "does not speak ZMQ" in note_text(view))
        relay.greet()
        until(view, lambda: view.watch.joined)
        said = note_text(view)
        assert "Watching" in said and "Problem" not in said, said
        time.sleep(0.2)  # the subscription reaches the PUB
        pub.publish(stored([11, 12], None))
        until(view, lambda: view.watch.mirror.batches == 1)
        assert blocks(view) == 2 and "Watching" in note_text(view)
    finally:
        view.close()
        relay.close()


def test_a_tab_event_older_than_the_last_applied_changes_nothing():
    """The page's tab events reach the server in any order (the select of the tab a page mounted
    on is unqueued): each carries the page's clock, and one older than the last applied is stale
    (in Chromium: tests/ui/test_vllm_tab_order_browser.py)."""
    v = VllmView()
    assert v.bring(True, 1290.0) and v.in_front
    assert not v.bring(False, 1200.0)  # the mount tab's select, sent before, landing after
    assert v.in_front
    assert v.bring(False, 1500.0) and not v.in_front  # the page left the tab later: it rests
    assert not v.bring(True, 1400.0) and not v.in_front
    assert v.bring(True, None) and v.in_front  # no clock (an API call): applied as it comes


def test_which_picture_shows_is_the_pages_own_business():
    """The vLLM tab's picture takes the session's picture's place by the page's class (pl-vllm,
    ui/theme.py), never by a server answer: the answers to quick tab clicks come back in any
    order, and a late answer to the vLLM tab put vLLM's picture over the Playground. So no event
    sets the vLLM picture's column, and no tab's select sets the session's picture but to draw
    that tab's run in it."""
    from ui.app import build_app

    config = build_app("dry (bookkeeping only, no model)").config
    by_elem = {c["props"].get("elem_id"): c["id"] for c in config["components"]}
    tabs = {c["id"]: c["props"].get("label") for c in config["components"] if c["type"] == "tabitem"}
    column, plot = by_elem["vllm-picture"], by_elem["pool-plot"]
    assert not [d for d in config["dependencies"] if column in d["outputs"]]
    vllm_tab = [d for d in config["dependencies"]
                if any(tabs.get(t) == "vLLM" for t, _ in d["targets"])]
    assert vllm_tab and not [d for d in vllm_tab if plot in d["outputs"]]
    unqueued_selects = [d for d in config["dependencies"] if not d["queue"]
                        and any(t in tabs and e == "select" for t, e in d["targets"])]
    assert unqueued_selects and not [d for d in unqueued_selects if plot in d["outputs"]]


def test_a_page_that_outlives_its_sessions_end_watches_again_from_the_replay():
    """Gradio ends a session (unload: VllmView.close) when its page's heartbeat connection
    breaks, and such a page lives on: its next tick watches the same endpoints again, the
    replay brings back the cache it had, and prompts go to the same API (the CI run where the
    tab said 'connecting…' for two minutes while its timer kept ticking)."""
    from engine.vllm.openai_client import OpenAIClient

    with_replay = Publisher(replay=True)
    view = VllmView()
    try:
        view.connect(with_replay.endpoint, with_replay.replay_endpoint, "http://127.0.0.1:9")
        client = view.client
        until(view, lambda: view.watch.joined)
        with_replay.publish(stored([11, 12], None))
        until(view, lambda: view.watch.mirror.batches == 1)
        _values(view, _Look, True)  # the page draws the two blocks
        view.close()  # Gradio's unload
        assert view.watch is None
        until(view, lambda: view.watch is not None and view.watch.mirror.batches >= 1)
        assert blocks(view) == 2 and view.client is client and isinstance(client, OpenAIClient)
        assert view.new == set()  # the replay brought back what the page showed: nothing new
        assert view.watch.replay_endpoint == with_replay.replay_endpoint
        until(view, lambda: "Watching" in note_text(view))
        with_replay.publish(stored([13], 12))
        until(view, lambda: blocks(view) == 3)
        assert view.new == {13}
        view.close()
        view.close()  # the state deleted an hour later: closed already, nothing to take up
        assert view.resume is None
    finally:
        view.close()
        with_replay.close()


def test_a_page_whose_session_ended_while_the_labs_vllm_started_waits_for_it_again(monkeypatch):
    from engine.vllm import lab

    monkeypatch.setattr(lab, "status", lambda: "starting (loading the model)")
    view = VllmView()
    view.waiting_for_lab = True  # as start_here leaves it while the lab's vLLM starts
    view.close()
    assert not view.waiting_for_lab
    view.poll()
    assert view.waiting_for_lab and "starting a vLLM here" in note_text(view)
    view.close()


def test_a_joined_vllm_that_sent_nothing_yet_is_watched_not_a_problem(pub, monkeypatch):
    """A vLLM started a moment ago has an empty cache and publishes nothing until a prompt
    comes: the tab says it is watching it, and why nothing came yet, not a "Problem" (the
    tab's Chromium test of a fresh server waited for 'Watching' and read a problem instead)."""
    monkeypatch.setattr(vllm_view, "SILENCE_S", 0.3)
    view = VllmView()
    try:
        view.connect(pub.endpoint)
        until(view, lambda: view.watch.joined and view.watch.problem is not None)
        said = note_text(view)
        assert said.startswith("Watching") and "no KV events came yet" in said, said
        assert "Problem" not in said and "--kv-events-config" in said, said
        assert said.count(pub.endpoint) == 1, said
        time.sleep(0.2)  # the subscription reaches the PUB
        pub.publish(stored([11], None))
        until(view, lambda: view.watch.mirror.batches == 1)
        assert note_text(view) == f"Watching `{pub.endpoint}` (events only: give its OpenAI API " \
                                  "under more to send prompts)"
    finally:
        view.close()


def test_a_message_within_a_second_of_the_timelines_drawing_is_drawn_at_a_later_tick(pub, monkeypatch):
    """The timeline is drawn at most every TIMELINE_S; a message that came sooner is drawn at a
    tick after that even when nothing else comes (it stayed "No KV event yet" under a tree of
    six blocks once a page's watch was taken up again)."""
    from ui import vllm_panel

    # the interval is long while the message comes and the tree is drawn, then over: a tick of
    # its own (a wall-clock interval of 0.3 s read the message as later than it once the
    # machine was loaded, and drew the timeline at the first call)
    monkeypatch.setattr(vllm_panel, "TIMELINE_S", 60.0)
    view = watching(pub)  # drew the tree and the timeline of one message
    try:
        pub.publish(stored([13], 12))
        until(view, lambda: view.watch.mirror.batches == 2)
        tree, timeline, *_ = _values(view, _Look, False)  # the tree now; the timeline waits
        assert tree != gr.skip() and timeline == gr.skip()
        monkeypatch.setattr(vllm_panel, "TIMELINE_S", 0.0)  # its interval is over
        view.poll()  # a tick that finds nothing new
        tree, timeline, *_ = _values(view, _Look, False)
        assert tree == gr.skip() and timeline != gr.skip()  # gr.skip() is a new dict each call
        assert view.timeline_drawn[0] == 2
    finally:
        view.close()


def test_the_tabs_line_is_sent_again_every_few_seconds_changed_or_not():
    """Answers reach the page in the order they are sent: a select's, computed while the line
    said "connecting to ...", can land after the tick that carried the new line. A loaded full
    run saw the tab keep "connecting to ..." for 120 s while its ticks ran, since ticks send
    changes only. So a tick sends the line again once NOTE_RESEND_S has passed."""
    view = VllmView()
    view.note = "connecting to tcp://127.0.0.1:9…"
    try:
        *_, note = _values(view, _Look, False)
        assert note.startswith("connecting to")
        *_, note = _values(view, _Look, False)
        assert note == gr.skip()  # just sent, unchanged
        view.note_sent_at -= NOTE_RESEND_S  # its interval is over
        *_, note = _values(view, _Look, False)
        assert note.startswith("connecting to")
        *_, note = _values(view, _Look, False)
        assert note == gr.skip()
    finally:
        view.close()


def test_a_tick_rests_only_when_the_page_shows_another_tab():
    """The page says, on each tick, whether the vLLM tab is selected (`TICK_JS`), and that
    outranks the server's idea from tab events: a late off-event admitted by its clock once left
    a shown tab's watch resting on "connecting to ..." for good (a loaded clean-clone run)."""
    from ui.app import build_app
    from ui.session import Session
    from ui.settings_panel import engine_config
    from ui.vllm_panel import TICK_JS

    dry = "dry (bookkeeping only, no model)"
    demo = build_app(dry)
    (tick,) = [f for f in demo.fns.values() if f.name == "on_vllm_tick"]
    assert tick.js == TICK_JS and isinstance(tick.inputs[-1], gr.Checkbox)
    session = Session(engine_config(dry, 4, 32, True, "auto"))
    view = VllmView()
    view.in_front = False  # the server's flag says another tab: a late off-event won
    try:
        assert not isinstance(tick.fn(view, session, True)[-1], gr.Timer)  # it ticks on
        rests = tick.fn(view, session, False)
        assert isinstance(rests[-1], gr.Timer) and rests[-1].active is False
        view.in_front = True
        assert not isinstance(tick.fn(view, session, None)[-1], gr.Timer)  # no page: the flag
        view.in_front = False
        assert tick.fn(view, session, None)[-1].active is False
    finally:
        view.close()


def test_a_tick_that_sends_no_tree_does_not_count_as_one_that_did():
    """The tab says how to begin (an empty tree) until a tree reached the page: a tick that
    skipped the tree (nothing new to draw) must not stand for it. (`gr.skip()` makes a new
    dict each call, so an identity test against it counted every tick as a drawing.)"""
    view = VllmView()
    view.drawn = view.version  # nothing new: this tick skips the tree
    tree, *_ = _values(view, _Look, False)
    assert tree == gr.skip()
    view.version += 1  # something changed, still nothing watched
    tree, *_ = _values(view, _Look, False)
    assert tree != gr.skip() and tree.layout is not None  # the empty tree, saying how to begin
