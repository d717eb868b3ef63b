"""Classroom rooms without a server: limits with clear messages, the teacher's secret and actions
(pause, step, shrink forcing preemption, prefix caching off, clear), isolation of rooms, idle
close. Dry rooms (bookkeeping only) keep these fast; tests/classroom/test_rooms_served.py runs the real
model through the API and a browser."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from classroom import RoomError, RoomRegistry, RoomSettings

DRY = {"model": "dry", "block_size": 4, "num_blocks": 48, "swap_blocks": 8, "max_tokens": 6,
       "system_prompt": "You are a tutor for the class."}


def wait_for(cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def all_done(room) -> bool:
    reqs = room.view.state["requests"]
    return bool(reqs) and all(r["status"] == "done" for r in reqs)


@pytest.fixture
def registry():
    reg = RoomRegistry(max_rooms=3)
    yield reg
    reg.close_all()


def test_requests_finish_share_the_system_prompt_and_keep_their_own_text(registry):
    room = registry.open(DRY)
    ids = [room.submit(f"student-{i}", f"question number {i}") for i in range(8)]
    assert ids == list(range(8))
    wait_for(lambda: all_done(room))
    state = room.view.state
    assert [r["prompt"] for r in state["requests"]] == [f"question number {i}" for i in range(8)]
    assert all(len(r["text"]) == 6 and r["finish_reason"] == "length" for r in state["requests"])
    # the 30-character system prompt fills 7 blocks of 4: every request after the first hits them
    assert state["prefix_hit_blocks"] >= 7 * 7
    assert state["students"] == 8 and state["used_blocks"] == 0
    room.engine.check_invariants()


def test_limits_say_what_is_wrong_and_change_nothing(registry):
    room = registry.open({**DRY, "max_students": 2, "requests_per_student": 1, "max_prompt_chars": 20})
    room.control(room.secret, "pause")
    with pytest.raises(RoomError, match="at most 20"):
        room.submit("a", "x" * 21)
    with pytest.raises(RoomError, match="U\\+0000"):
        room.submit("a", "nul\x00here")
    with pytest.raises(RoomError, match="type a prompt"):
        room.submit("a", "   ")
    room.submit("a", "first")
    with pytest.raises(RoomError, match="you have sent 1 requests"):
        room.submit("a", "second")
    room.submit("b", "hello")
    with pytest.raises(RoomError, match="full: it has 2 students"):
        room.submit("c", "me too")
    assert len(room.view.state["requests"]) == 2
    room.engine.check_invariants()
    with pytest.raises(RoomError, match="unknown room setting"):
        RoomSettings.parse({"modle": "dry"})
    with pytest.raises(RoomError, match="model must be one of"):
        RoomSettings.parse('{"model": "/etc/passwd"}')
    with pytest.raises(RoomError, match="pool size"):
        RoomSettings.parse({"model": "default", "block_size": 16, "num_blocks": 100000})


def test_only_the_secret_controls_and_step_moves_one_step(registry):
    room = registry.open(DRY)
    with pytest.raises(RoomError, match="only the teacher"):
        room.control("not-it", "pause")
    with pytest.raises(RoomError, match="only the teacher"):
        room.control(None, "clear")
    room.control(room.secret, "pause")
    room.submit("a", "paused prompt")
    time.sleep(0.05)  # a paused room must not step on its own (nothing to wait for: it must not move)
    assert room.view.state["step"] == 1 and room.view.state["requests"][0]["status"] == "waiting"
    room.control(room.secret, "step")
    state = room.view.state
    assert state["step"] == 2 and state["paused"]
    assert state["requests"][0]["status"] == "running" and state["requests"][0]["blocks"]
    with pytest.raises(RoomError, match="unknown action"):
        room.control(room.secret, "explode")
    room.control(room.secret, "resume")
    wait_for(lambda: all_done(room))
    before = dict(room.view.state)
    with pytest.raises(RoomError, match="nothing to step"):
        room.control(room.secret, "step")
    # a refused step says why and changes nothing else: the room is not paused
    assert not room.view.state["paused"] and room.view.state["step"] == before["step"]


def test_shrinking_the_pool_forces_preemption_and_restore_gives_it_back(registry):
    room = registry.open({**DRY, "num_blocks": 40, "swap_blocks": 4, "max_tokens": 24, "system_prompt": ""})
    room.control(room.secret, "pause")
    for i in range(6):
        room.submit(f"s{i}", f"prompt {i}")
    room.control(room.secret, "step")
    room.control(room.secret, "step")
    with pytest.raises(RoomError, match="from 8"):  # the largest request needs 8 blocks of 4
        room.control(room.secret, "shrink", 3)
    said = room.control(room.secret, "shrink", 12)
    assert "12 of 40" in said
    room.control(room.secret, "resume")
    wait_for(lambda: all_done(room))
    state = room.view.state
    assert state["preemptions"] > 0
    assert any(r["preemptions"] for r in state["requests"])
    assert all(len(r["text"]) == 24 for r in state["requests"])
    assert state["reserved_blocks"] == 28 and state["usable_blocks"] == 12
    # the reserve is one hatched region with no table rows and no tokens, and the numbers add up
    from ui.room_render import class_blocks, projector_figure

    assert len(room.view.reserved) == 28 and "reserved by the teacher" not in room.view.seq_labels.values()
    fig = projector_figure(room.view)
    hatched = [t for t in fig.data if t.name == "reserved by the teacher"]
    assert hatched and hatched[0].fillpattern.shape == "/"
    pool = next(t for t in fig.data if t.name == "pool")
    drawn = {cd[0]: (t or "") for zr, tr, cr in zip(pool.z, pool.text, pool.customdata, strict=True)
             for t, cd in zip(tr, cr, strict=True) if cd is not None and cd[0] in room.view.reserved}
    assert drawn and all(not t or t.split()[0].isdigit() for t in drawn.values())  # ids, no tokens
    assert class_blocks(state) == "0 of 12 · reserved by the teacher: 28 (of the pool's 40)"
    # on a projector every line of the picture fits its width: the pool's caption, with the
    # reserve in its words, ran past the right edge at 1280 x 720 (the picture's box about 790 px)
    import re

    from viz.text_width import text_px

    for box in ((790, 600), (800, 650), (1100, 800)):
        big = projector_figure(room.view, box=box, large=True)
        for note in big.layout.annotations:
            plain = re.sub(r"<[^>]+>", "", note.text or "")
            if plain.startswith("GPU pool"):
                assert text_px(plain, note.font.size) <= box[0] - 16, (box, plain, note.font.size)
    # the class's prefix tree: the requests' blocks, none of the reserve's filler (held, or
    # cached once Whole pool gave it back)
    def tree_blocks() -> set[int]:
        return {n.block_id for n in room.view.tree.nodes}

    assert tree_blocks() and not tree_blocks() & set(room.view.reserved)
    room.engine.check_invariants()
    reserved = set(room.view.reserved)
    room.control(room.secret, "restore")
    assert room.view.state["reserved_blocks"] == 0 and room.view.state["used_blocks"] == 0
    assert not tree_blocks() & reserved
    assert tree_blocks() == {n.block_id for n in room.engine.prefix_tree().nodes} - reserved
    with pytest.raises(RoomError, match="pool has 40"):
        room.submit("big", "x" * 300)  # 300 bytes + 24 tokens > 40 blocks of 4


def test_prefix_caching_off_stops_hits_and_clear_starts_fresh(registry):
    room = registry.open(DRY)
    room.submit("a", "one")
    wait_for(lambda: all_done(room))
    room.control(room.secret, "prefix_off")
    room.submit("b", "two")
    wait_for(lambda: all_done(room))
    assert room.view.state["prefix_hit_blocks"] == 0 and not room.view.state["prefix_caching"]
    room.control(room.secret, "prefix_on")
    room.submit("c", "three")
    wait_for(lambda: all_done(room))
    assert room.view.state["prefix_hit_blocks"] > 0
    room.control(room.secret, "clear")
    state = room.view.state
    assert state["requests"] == [] and state["students"] == 0 and state["step"] == 0
    assert room.cleared(2) and not room.cleared(3)
    assert room.submit("a", "after the clear") == 3  # ids stay unique across a clear


def test_rooms_are_isolated_and_the_registry_has_a_cap(registry):
    a, b = registry.open(DRY), registry.open(DRY)
    assert a.code != b.code and a.secret != b.secret
    a.submit("x", "only in room a")
    wait_for(lambda: all_done(a))
    assert b.view.state["requests"] == [] and b.view.state["step"] == 0
    with pytest.raises(RoomError, match="only the teacher"):
        b.control(a.secret, "pause")
    assert registry.get(a.code.lower()) is a
    registry.open(DRY)
    with pytest.raises(RoomError, match="3 rooms open"):
        registry.open(DRY)
    with pytest.raises(RoomError, match="no open room has the code"):
        registry.get("NOPE42")


def test_an_idle_room_closes_itself_and_leaves_the_registry():
    reg = RoomRegistry(idle_seconds=0.3)
    room = reg.open(DRY)
    room.submit("a", "hi")
    wait_for(lambda: len(reg) == 0, timeout=20)
    assert room.closed and "without activity" in room.view.state["error"]
    with pytest.raises(RoomError, match="closed"):
        room.submit("a", "still there?")


def test_the_pages_draw_a_room_with_each_request_under_its_student(registry):
    from ui.room_render import metrics_html, projector_figure, queues_html, requests_html, student_html

    room = registry.open(DRY)
    room.control(room.secret, "pause")
    a = room.submit("key-a", "first prompt", "Ana")
    room.submit("key-b", "second <b>prompt</b>", "Ben")
    room.control(room.secret, "step")
    view = room.view
    assert sorted(view.seq_labels.values()) == ["Ana · #0", "Ben · #1"]
    fig = projector_figure(view)
    head = fig.layout.title.text.split("<br>")[0]  # the head line, in its larger span
    assert f"<b>engine step {view.state['step']}</b>" in head
    rows = [a.text for a in fig.layout.annotations]
    assert "Ana · #0" in rows and "Ben · #1" in rows  # each row of the picture names its student
    assert "#0 Ana" in queues_html(view) and "running" in queues_html(view)
    assert "students</td><td>2" in metrics_html(view)
    assert "second &lt;b&gt;prompt" in requests_html(view)  # a prompt is text, never markup
    mine = student_html(view, [a], cleared=False)
    assert "first prompt" in mine and "second" not in mine and "id='student-pool'" in mine


def test_a_request_keeps_the_name_the_student_typed_for_it(registry):
    """A student who changes the name field between prompts gets each request under the name it
    was sent with (three prompts from one phone were all "Ada" once); another student's name is
    never taken over, and a student counts once."""
    room = registry.open(DRY)
    room.control(room.secret, "pause")
    room.submit("phone-1", "first prompt", "Ada")
    room.submit("phone-1", "second prompt", "Grace")
    room.submit("phone-2", "third prompt", "Grace")
    room.submit("phone-1", "fourth prompt", "Grace")
    names = [r["student"] for r in room.view.state["requests"]]
    assert names == ["Ada", "Grace", "Grace (2)", "Grace"]
    assert room.view.state["students"] == 2
