"""A classroom room's views of the run (issue 34), on a dry room: the timeline has a lane per
student's request named by the student, its steps the room's; a memory point for every step,
each equal to the counts of the snapshot published with it; the prefix tree a trunk (the class's
system prompt) and a branch per student; each view drawn for the projector."""

from __future__ import annotations

import pytest

from classroom import RoomRegistry
from engine.describe.memory_use import memory_point
from tests.classroom.test_rooms import DRY, all_done, wait_for
from ui.run_views import room_view


@pytest.fixture
def registry():
    reg = RoomRegistry(max_rooms=2)
    yield reg
    reg.close_all()


def test_a_rooms_views_are_its_run(registry):
    room = registry.open({**DRY, "num_blocks": 40})
    published = []
    publish = room._publish

    def keep() -> None:  # every view the room publishes, to compare with its memory points
        publish()
        published.append(room.view)
    room._publish = keep
    room.control(room.secret, "pause")
    for name in ("Ada", "Bo", "Cy"):
        room.submit(f"key-{name}", f"Why is the sky blue, asks {name}?", name=name)
    room.control(room.secret, "resume")
    wait_for(lambda: all_done(room))
    view = room.view
    timeline = view.timeline
    assert [view.names[ln.request_id] for ln in timeline.lanes] == ["Ada #0", "Bo #1", "Cy #2"]
    assert [p.step for p in view.memory] == list(timeline.columns)
    by_step = {}
    for v in published:  # the last view published after each step
        if v.snapshot is not None and v.events:
            by_step[v.snapshot.step] = v
    for point in view.memory:
        v = by_step[point.step]
        assert point == memory_point(v.snapshot, v.events)
        assert point.used == v.state["used_blocks"] and point.cached == v.state["cached_blocks"]
    kids = view.tree.children()
    assert len(kids[None]) == 1  # one system prompt: one first block, the class's trunk
    assert any(len(c) == 3 for h, c in kids.items() if h is not None)  # three students' branches
    for choice, key in (("timeline", "timeline"), ("memory", "memory"), ("prefix tree", "tree")):
        fig = room_view(view, choice, (860, 620), True)
        assert fig.layout.meta["view"] == key
    assert room_view(view, "none", (860, 620), True) is None


def test_shrink_pool_and_clicks_add_no_memory_points(registry):
    """Issue 42, item 12: while Shrink pool tops up its reserve after a step (operations of its
    own, which move the snapshot's step on), the point was stamped with the snapshot's step, so
    every later publish (a teacher's click, a student's answer) added the same serving step's
    point again: more points than the timeline's columns, and preemptions marked twice."""
    room = registry.open({**DRY, "num_blocks": 40, "swap_blocks": 4, "max_tokens": 24,
                          "system_prompt": ""})
    room.control(room.secret, "pause")
    for i in range(6):
        room.submit(f"s{i}", f"prompt {i}")
    for _ in range(12):  # the class holds most of the pool: the reserve fills as they free
        room.control(room.secret, "step")
    room.control(room.secret, "shrink", 12)
    assert room.view.state["reserved_blocks"] < 28  # the rest comes by top-ups after steps
    while room.engine.has_pending_work():
        room.control(room.secret, "step")
        room.control(room.secret, "pause")  # a click that publishes again, with no step
    view = room.view
    assert view.state["preemptions"] > 0
    assert [p.step for p in view.memory] == list(view.timeline.columns)
    assert sum(p.preemptions for p in view.memory) == view.state["preemptions"]
