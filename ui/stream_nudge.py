"""The nudge: a hidden button on every page whose no-op event reopens Gradio's event stream when
the page's client missed an answer.

Gradio's page client takes every answer from one event stream per page, which the server closes
when nothing of the page's is pending. A request joined in that moment is answered on the
server, but the client had read its join reply before the closing message, saw its stream still
open and opened none: the answer waits on the server until the page's next request opens the
stream again. On a loaded server (a busy Space, a class) that left a lesson page's follower
pending for minutes: a timer on the view, and, its trigger mode deferring every later press to
after it, a view under the picture that never followed the page again. The page's script
(ui/nudge.js) presses this button while something has been under way for a few seconds: a
request after the lost one, which opens the stream, and the waiting answer arrives.
"""

from __future__ import annotations

import gradio as gr

NUDGE_ID = "pl-nudge"


def _nothing() -> None:
    """The server's part of a nudge: none (the request itself is the point)."""


def nudge_button() -> gr.Button:
    """The hidden button and its event, on the page being built (main page or a room page).
    Every press joins the queue ("multiple": a nudge lost the same way is followed by the next)."""
    button = gr.Button("nudge", elem_id=NUDGE_ID, elem_classes=["pl-hidden"])
    button.click(_nothing, None, None, show_progress="hidden", trigger_mode="multiple")
    return button
