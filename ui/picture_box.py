"""The picture's box: how much room the page gives the main picture, measured in the browser
(ui/motion.js writes "WIDTHxHEIGHT" into a hidden textbox and presses a hidden button) and kept
on the session (the page's look, whichever run is in front), so that every figure is drawn to
fit it (viz/fit.py). A new box (the window resized, presenter mode turned on, a phone turned)
redraws the picture at once."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gradio as gr

from ui.front import front
from ui.page import SCRIPTED, Page
from ui.session import Session

BOX = re.compile(r"^(\d{2,5})x(\d{1,5})(?:#(\d{1,16}))?(?:#([01]))?$")
MAX_PX = 8192  # a box larger than any screen is a typo or a probe: ignored


def parse_box(value: Any) -> tuple[int, int] | None:
    """(width, height) from "820x640" (or "820x640#<time>"), or None for anything else (height
    0: as tall as needed)."""
    m = BOX.match(str(value or "").strip())
    if not m:
        return None
    w, h = int(m.group(1)), int(m.group(2))
    return (w, h) if 100 <= w <= MAX_PX and h <= MAX_PX else None


def box_slide(value: Any) -> bool | None:
    """Whether the page was a slide (presenter mode) when it measured the box (None: unsaid)."""
    m = BOX.match(str(value or "").strip())
    return None if not m or m.group(4) is None else m.group(4) == "1"


def box_time(value: Any) -> int:
    """When the page measured the box (its "#<time>"; 0 without one)."""
    m = BOX.match(str(value or "").strip())
    return int(m.group(3)) if m and m.group(3) else 0


def take_box(value: Any, session: Session) -> bool:
    """Keep the box the page measured; False for a report overtaken by a later one, or none. The
    picture's handler and the view's both call it: either may run first, and both must draw for
    the same box."""
    size, at = parse_box(value), box_time(value)
    if size is None or at < session.box_at:
        return False
    session.box, session.box_at = size, at
    slide = box_slide(value)
    if slide is not None:  # the page's own word: presenter mode's event may still be on its way
        session.presenter = slide
    return True


def box_panel(page: Page) -> Callable[[], None]:
    """The hidden box and its button; returns the function that wires them (once the picture
    exists)."""
    box = gr.Textbox(elem_id="pl-box", elem_classes=["pl-hidden"], show_label=False,
                     container=False)
    go = gr.Button("picture box", elem_id="pl-box-go", elem_classes=["pl-hidden"])
    page.box_input, page.box_go = box, go  # the views under the picture follow it too

    def on_box(value, session: Session):
        if not take_box(value, session):
            return gr.update()
        picture = front(session).picture()
        return gr.update() if picture is None else picture

    def wire() -> None:
        go.click(on_box, [box, page.state], [page.plot], show_progress="hidden", **SCRIPTED)
    return wire
