"""How often Gradio's queue looks for work while it has none.

Gradio's queue wakes every 1 ms when free, and its progress sender every 10 ms (on Linux): an
idle app spent about 5% of a core waking up (0.47 CPU-s in 10 s, a dry app with no page open),
and each app beside it on a 2-core machine (a Space's CPU, a test suite's several served apps)
paid for it. Every 10 ms and 50 ms instead: an event waits at most 10 ms more to start, and a
progress bar moves 20 times a second.
"""

from __future__ import annotations

from typing import Any

IDLE_POLL_S = 0.01
PROGRESS_POLL_S = 0.05


def calm_queue(demo: Any) -> None:
    """Set the queue's idle polls (after demo.queue()); a Gradio without these attributes (its
    internals changed) keeps its own."""
    queue = getattr(demo, "_queue", None)
    if queue is None:
        return
    if hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, IDLE_POLL_S)
    if hasattr(queue, "progress_update_sleep_when_free"):
        queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, PROGRESS_POLL_S)
