"""The views of the run under the main picture (request timeline, memory over time, the prefix
cache as a tree) for a session, a lesson page or a classroom room: which figure, from which
recorded data, in which box. Pure reads: a session's recorded frames (history/frame.py), a
lesson's recorded pages, a room's published view; no engine moves for any of them.

The picture and its view share the picture's box (ui/picture_split.py): on a slide the picture
first, the view under it in what the picture leaves; elsewhere each is as tall as it needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.describe.memory_use import MemoryPoint
from lessons.front_matter import VIEWS  # noqa: F401  (the choices under the picture, for the pages)
from ui.picture_split import split_box
from viz.memory import memory_figure
from viz.prefix_tree_figure import prefix_tree_figure, sole_owners
from viz.timeline import timeline_figure
from viz.view_frame import note_figure

NO_STEPS = ("No serving step yet: add a request in Serving (or load a workload) and press Step "
            "or Run to the end.")


def seq_labels(requests: Sequence[Any], timeline: Any) -> dict[int, str]:
    """Each live sequence of a serving request named as the request it serves: "req 3", or for
    a group "req 3 · sample 2" / "req 3 · beam 1" (its place among the live ones), with its id."""
    kinds = {ln.request_id: ln.kind for ln in (timeline.lanes if timeline is not None else ())}
    out = {}
    for r in requests:
        kind = kinds.get(r.request_id, "request")
        for i, sid in enumerate(r.live_seq_ids):
            if kind == "request" and len(r.live_seq_ids) == 1:
                out[sid] = f"req {r.request_id} (seq {sid})"
            else:
                what = "beam" if kind == "beams" else "sample"
                out[sid] = f"req {r.request_id} · {what} {i + 1} (seq {sid})"
    return out


def session_series(session: Any) -> list[MemoryPoint]:
    """Every serving step's memory point in the session's log (recorded views only)."""
    out = []
    for pos in range(1, len(session.ops) + 1):
        view = session.recorded(pos)
        if view is not None and view.memory is not None:
            out.append(view.memory)
    return out


def session_timeline(session: Any) -> Any:
    """The whole run's timeline: recorded at the log's end, else at the cursor."""
    end = session.recorded(len(session.ops))
    return (end or session.frame()).timeline


def session_view(session: Any, box: tuple[int, int] | None) -> Any:
    """The figure under the session's picture, in `box` (None: none, or no room on the slide:
    ui/picture_split.py)."""
    choice = session.view_choice
    if choice == "none" or box is None:
        return None
    large = session.presenter
    if choice == "prefix tree":
        view = session.frame()
        previous = session.recorded(session.pos - 1) if session.pos else None
        before = session.prefix_tree(previous) if previous is not None else None
        return prefix_tree_figure(session.prefix_tree(view), view.events if session.pos else (),
                                  session.decode, before=before,
                                  selected_block=session.selected_block, box=box, large=large,
                                  owners=sole_owners(view.snapshot))
    if choice == "memory":
        series = session_series(session)
        if not series:
            return note_figure("Memory over time", NO_STEPS, box, large)
        return memory_figure(series, session.frame().snapshot.num_blocks, session.pos, box=box,
                             large=large)
    timeline = session_timeline(session)
    if timeline is None or not timeline.steps:
        return note_figure("Requests over time", NO_STEPS, box, large)
    return timeline_figure(timeline, session.pos, open_request=session.open_request,
                           selected=session.selected_request, box=box, large=large)


def request_seq(requests: Sequence[Any], request_id: int) -> int | None:
    """A live sequence of the request (its blocks light up in the picture), or None."""
    r = next((r for r in requests if r.request_id == request_id), None)
    return r.live_seq_ids[0] if r is not None and r.live_seq_ids else None


def request_blocks(requests: Sequence[Any], request_id: int | None) -> tuple[int, ...]:
    """The GPU blocks a request's live sequences hold (none once it finished, or while it waits
    or sits in swap space)."""
    r = next((r for r in requests if r.request_id == request_id), None)
    return r.block_ids if r is not None and r.status in ("running", "loading") else ()


def lesson_slide_choice(ls: Any, box: tuple[int, int] | None) -> str:
    """What the lesson shows under its picture on this page: its choice; on a slide (a box with
    a height) none where the view would have nothing to draw yet, so the picture takes the slide."""
    choice, run = ls.view_choice, ls.run
    if choice == "none" or run is None or not box or not box[1]:
        return choice
    frame = run.frame_at(run.current)
    if choice == "timeline":
        return choice if frame.timeline is not None and frame.timeline.steps else "none"
    if choice == "prefix tree":
        return choice if run.history.prefix_tree(frame).nodes else "none"
    return "none"  # memory over time follows a serving run, not a lesson


def lesson_view(ls: Any, large: bool, box: tuple[int, int] | None) -> Any:
    """The figure under a lesson's picture, in `box`: its page's moment (None: the lesson shows
    none, or the slide has no room for it)."""
    choice, run = ls.view_choice, ls.run
    if choice == "none" or run is None or box is None:
        return None
    step = run.current
    if choice == "memory":
        return note_figure("Memory over time", "Memory over time follows a serving run: open the "
                           "Serving tab, or a classroom room.", box, large)
    frame = run.frame_at(step)
    if choice == "prefix tree":
        previous = run.frame_at(run.views[step.index - 1]) if step is not None and step.index else None
        history = run.history
        return prefix_tree_figure(history.prefix_tree(frame), step.events if step is not None else (),
                                  run.decode, before=history.prefix_tree(previous) if previous else None,
                                  selected_block=ls.inspected, box=box, large=large,
                                  owners=sole_owners(frame.snapshot))
    timeline = frame.timeline
    if timeline is None or not timeline.steps:
        return note_figure("Requests over time", "The lesson has run no serving step yet: press "
                           "Next.", box, large)
    return timeline_figure(timeline, frame.snapshot.step, box=box, large=large)


def room_view(view: Any, choice: str, box: tuple[int, int] | None, large: bool) -> Any:
    """The figure under a classroom room's picture, from its published view (None: none)."""
    if choice == "none" or view is None or view.snapshot is None:
        return None
    _, box = split_box(box, choice)
    if choice == "prefix tree":
        return prefix_tree_figure(view.tree, view.events, view.decode, box=box, large=large,
                                  title="The class's prefix cache", owners=sole_owners(view.snapshot))
    if choice == "memory":
        if not view.memory:
            return note_figure("Memory over time", "No step yet: the room steps once a student "
                               "sends a prompt.", box, large)
        return memory_figure(view.memory, view.snapshot.num_blocks, view.snapshot.step, box=box,
                             large=large)
    timeline = view.timeline
    if timeline is None or not timeline.steps:
        return note_figure("Requests over time", "No step yet: the room steps once a student "
                           "sends a prompt.", box, large)
    return timeline_figure(timeline, view.snapshot.step, labels=view.names, box=box, large=large,
                           title="The class's requests over time")
