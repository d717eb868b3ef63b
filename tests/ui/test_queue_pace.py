"""The app's queue polls for work every 10 ms, not Gradio's 1 ms (ui/queue_pace.py): on this
Gradio the attributes it sets exist, so an upgrade that renames them fails here instead of
silently polling at 1 ms again."""

from __future__ import annotations

import gradio as gr

from ui.queue_pace import IDLE_POLL_S, PROGRESS_POLL_S, calm_queue


def test_the_queue_polls_at_the_calmer_pace():
    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    queue = demo._queue
    assert queue.sleep_when_free < IDLE_POLL_S  # Gradio's own pace, which this changes
    calm_queue(demo)
    assert (queue.sleep_when_free, queue.progress_update_sleep_when_free) == (IDLE_POLL_S, PROGRESS_POLL_S)

