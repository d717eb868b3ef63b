"""Moving over the session's operation log: Back, Next, Undo, Reset, Play / Pause (a gr.Timer)
and the timeline slider. A compact bar beside the picture. A move sends the view under the
picture with the picture (ui/views_panel.py), not in a second call after it: Back and Next
are the clicks a visitor repeats fastest."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from ui import limits
from ui.page import Page, guard, show
from ui.session import Session
from ui.views_panel import draw


def timeline_panel(page: Page) -> tuple[gr.Group, Callable[[], None]]:
    with gr.Group(elem_id="timeline-bar") as bar:
        with gr.Row():
            back = gr.Button("◀ Back", size="sm", min_width=60, elem_id="tl-back")
            nxt = gr.Button("Next ▶", size="sm", min_width=60, elem_id="tl-next")
            undo = gr.Button("Undo", size="sm", min_width=50)
            reset = gr.Button("Reset", size="sm", min_width=50)
            play = gr.Button("Play", size="sm", min_width=50, elem_id="tl-play")
            pause = gr.Button("Pause", size="sm", min_width=50, elem_id="tl-pause")
        page.timeline = gr.Slider(0, 1, value=0, step=1, label="timeline (operations)")
        speed = gr.Slider(0.2, 3, value=1, step=0.1, label="seconds per step (Play)")
    timer = gr.Timer(1.0, active=False)

    def moved(session: Session) -> tuple:
        return (*show(session), *draw(session))

    @guard
    def on_goto(pos, session: Session):
        session.goto(limits.whole(pos, "the timeline position", 0, 1 << 62))
        return moved(session)

    def on_back(session: Session):
        session.goto(session.pos - 1)
        return moved(session)

    def on_next(session: Session):
        session.goto(session.pos + 1)
        return moved(session)

    def on_undo(session: Session):
        session.undo()
        return moved(session)

    def on_reset(session: Session):
        return moved(session.fresh())

    def on_play(session: Session):
        return gr.Timer(active=True), session

    def on_tick(session: Session):
        if session.pos >= len(session.ops):
            return (gr.Timer(active=False), *moved(session))
        session.goto(session.pos + 1)
        # the timer as it is, never switched on again here: a tick still on its way when Pause
        # is clicked would otherwise start the timer again after it (a loaded machine's answer
        # takes seconds), and the replay would run on past Pause
        return (gr.skip(), *moved(session))

    def wire() -> None:
        outs, quiet, state = [*page.outs, *page.view_outs], page.quiet, page.state
        page.timeline.release(on_goto, [page.timeline, state], outs, **quiet)
        back.click(on_back, [state], outs, **quiet)
        nxt.click(on_next, [state], outs, **quiet)
        undo.click(on_undo, [state], outs, **quiet)
        reset.click(on_reset, [state], outs, **quiet)
        play.click(on_play, [state], [timer, state])
        pause.click(lambda: gr.Timer(active=False), None, [timer])
        speed.change(lambda s: gr.Timer(value=float(s)), [speed], [timer])
        timer.tick(on_tick, [state], [timer, *outs], **quiet)
    return bar, wire
