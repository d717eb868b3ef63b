"""The Gradio app: the main picture is the page, the controls of the current mode beside it.

Layout: a thin top bar (title, status, presenter mode, reduce motion); then the picture (left,
~70% wide) and a column beside it: mode tabs (Playground, Serving, Lessons, Compare, vLLM, Settings),
the timeline bar, the block inspector and the events of the last step; the sequences' text and
the numbers below both. On a phone the column wraps under the picture. Each panel lives in its
own module with its callbacks (ui/*_panel.py, ui/lesson_player.py); this file composes them.

Data flows one way: a click runs an engine operation on the session (ui/session.py), and the page
is redrawn from the new snapshot (ui/render.py -> viz/). Every refused operation becomes a
gr.Error with the engine's message; the session stays as it was.
"""

from __future__ import annotations

import sys

import gradio as gr

from classroom import RoomRegistry
from ui import tp_panel, views_panel
from ui.compare import compare_tab
from ui.gpu import ON_ZEROGPU
from ui.inspector_panel import inspector_panel
from ui.lesson_player import lessons_tab
from ui.page import Follower, Page, show, wire_follow
from ui.picture_box import box_panel
from ui.playground_panel import playground_panel
from ui.room_pages import add_room_pages
from ui.serving_panel import serving_panel
from ui.session import Session, UserError
from ui.settings_panel import MODES, engine_config, settings_panel
from ui.stream_nudge import nudge_button
from ui.tab_clock import CLOCK_JS
from ui.theme import CSS, HEAD, PRESENTER_JS, REDUCE_MOTION_JS, THEME
from ui.timeline_panel import timeline_panel
from ui.vllm_panel import VllmTarget, picture_part, vllm_panel
from ui.vllm_view import VllmView

__all__ = ["CSS", "HEAD", "MODES", "THEME", "VllmTarget", "build_app"]


#: what this is, in one line, and where to start (the lesson link opens lesson 1's first page)
LANDING = ("<p>Watch a real language model keep its KV cache in fixed-size blocks, as vLLM's "
           "PagedAttention does, one operation at a time. New here? "
           "<a id='landing-start' href='?lesson=01_kv_cache'>Start with lesson 1 →</a></p>")


def _look(_: bool) -> None:
    """Presenter mode and reduce motion are classes on the page's <body>, set by their js."""


def build_app(default_mode: str = "SmolLM2-135M (real model)", device: str = "auto",
              startup_note: str = "", vllm_target: VllmTarget | None = None) -> gr.Blocks:
    try:
        first = Session(engine_config(default_mode, 16 if MODES[default_mode] else 4,
                                      64 if MODES[default_mode] else 32, True, device))
    except UserError as err:  # limits set too low for the default engine: say so at start
        raise SystemExit(f"PagedLab cannot start: {err}") from err

    page = Page(device)
    # delete_cache: files Gradio cached for this app (exported traces, uploads) go after an hour
    with gr.Blocks(title="PagedLab", delete_cache=(3600, 3600), fill_width=True) as demo:
        # a session closed by its browser (or idle for a day) frees its engine at once
        page.state = gr.State(first, time_to_live=24 * 3600, delete_callback=Session.close)
        with gr.Row(elem_id="top-bar", equal_height=True):
            with gr.Column(scale=4, min_width=240):
                gr.Markdown("**PagedLab**: a paged KV cache, block by block" + startup_note,
                            elem_id="title")
                gr.HTML(LANDING, elem_id="landing", padding=False, container=False)
                page.status = gr.Markdown(elem_id="status")
                # pressed by ui/motion.js when the status line's text changes: the followers of
                # the view (the view of the run, the inspector, the shards) hang on it, not on
                # the Markdown's own change event, which Gradio fires again without a change
                page.follow = gr.Button("follow", elem_id="pl-follow", elem_classes=["pl-hidden"])
                nudge_button()  # pressed by ui/nudge.js when an answer is slow to come
            with gr.Column(scale=1, min_width=240), gr.Row(elem_id="look"):
                presenter = gr.Checkbox(label="presenter mode", elem_id="presenter", min_width=110)
                reduce = gr.Checkbox(label="reduce motion", elem_id="reduce-motion", min_width=110)
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=7, min_width=300, elem_id="picture-col"):
                page.plot = gr.Plot(show_label=False, elem_id="pool-plot")
                shards = tp_panel.shards_plot()  # shown only while the engine has TP > 1
                views_panel.plot_part(page)  # the run over time or the prefix tree, if chosen
                vllm_picture = picture_part()  # a watched vLLM's cache, in the picture's place
            with gr.Column(scale=3, min_width=330, elem_id="controls-col"):
                with gr.Tabs() as tabs:
                    with gr.Tab("Playground", id="playground") as playground_tab:
                        wire_playground = playground_panel(page)
                    with gr.Tab("Serving", id="serving") as serving_tab:
                        wire_serving = serving_panel(page)
                    with gr.Tab("Lessons", id="lessons") as lesson_tab:
                        wire_lessons, lesson_link, lesson_view = lessons_tab(page, presenter)
                    with gr.Tab("Compare", id="compare") as compare_page:
                        compare_tab()
                    with gr.Tab("vLLM", id="vllm") as vllm_tab:
                        vllm = vllm_panel(page, vllm_picture, vllm_target)
                    with gr.Tab("Settings", id="settings") as settings_tab:
                        wire_settings = settings_panel(page, first, default_mode)
                # the step's events (and the playground's next move) right under the controls
                wire_views = views_panel.choice_part(page, presenter)
                page.events = gr.Markdown(elem_id="event-log")
                # the inspector beside the picture, under the events (before the timeline bar)
                wire_inspector = inspector_panel(page)  # the picture's engine: session or lesson
                # acts on the session only: shown by the page outside Lessons and vLLM (ui/theme.py)
                with gr.Column(elem_id="playground-tools"):
                    _, wire_timeline = timeline_panel(page)
                wire_box = box_panel(page)  # the page's room for the picture
        with gr.Row(elem_id="below"):  # under both columns: on a phone, after the controls
            with gr.Column(scale=7, min_width=300):
                page.seqs = gr.HTML(elem_id="sequences")
            with gr.Column(scale=3, min_width=300):
                page.metrics = gr.HTML(elem_id="metrics")
        for wire in (wire_playground, wire_serving, wire_lessons, wire_settings, wire_timeline,
                     wire_inspector, wire_box, wire_views):
            wire()

        # The picture shows the run of the tab in front: the session's, or the lesson's. Each
        # tab event carries the page's clock as it was sent (CLOCK_JS): quick clicks are
        # answered side by side, and an answer to a tab that a later click left draws nothing.
        clock = gr.Number(visible=False)

        def on_session_tab(session: Session, at: float | None):
            return page.in_front(session, session, at, lambda: show(session), page.outs)

        for tab in (playground_tab, serving_tab, settings_tab):
            tab.select(on_session_tab, [page.state, clock], page.outs, js=CLOCK_JS, **page.quiet)
        view_fn, view_inputs, view_outputs = lesson_view

        def on_lessons(ls, session: Session, at: float | None):
            # clicks on the picture now select the lesson's blocks
            return page.in_front(session, ls, at, lambda: view_fn(ls, session), view_outputs)

        lesson_tab.select(on_lessons, [*view_inputs, clock], view_outputs, js=CLOCK_JS)
        # The vLLM tab puts its watch in the picture's place; any other tab gives it back. The
        # page swaps the two itself (ui/theme.py, by the pl-vllm class ui/motion.js keeps): the
        # server's answers to quick tab clicks come back out of order, and a late one left
        # vLLM's picture over the Playground. The server follows which tab is in front for the
        # vLLM timer only, by the tab events' clock as above (VllmView.bring).

        def on_vllm_tab(view: VllmView, session: Session, at: float | None):
            if not view.bring(True, at):
                return tuple(gr.skip() for _ in vllm.outputs)
            return vllm.select(view, session)

        vllm_tab.select(on_vllm_tab, [vllm.view, page.state, clock], vllm.outputs,
                        js=CLOCK_JS, **page.quiet)

        def off_vllm_tab(view: VllmView, at: float | None) -> None:
            view.bring(False, at)  # its timer rests (unless a later event brought it back)

        for tab in (playground_tab, serving_tab, lesson_tab, compare_page, settings_tab):
            tab.select(off_vllm_tab, [vllm.view, clock], None, js=CLOCK_JS, queue=False)
        # the look changes in the page (js); the no-op keeps every event named for Gradio's API
        presenter.change(_look, [presenter], None, js=PRESENTER_JS, queue=False)

        def on_presenter(on: bool, session: Session):
            """Large type in the picture too, for whichever run is in front."""
            session.presenter = bool(on)
            return show(session)

        presenter.change(on_presenter, [presenter, page.state], page.outs, **page.quiet)
        reduce.change(_look, [reduce], None, js=REDUCE_MOTION_JS, queue=False)

        link_fn, link_inputs, link_outputs = lesson_link

        def on_lesson_link(ls, session: Session, request: gr.Request):
            """?lesson=02_paging&step=3 opens that lesson step, in the Lessons tab."""
            shown = link_fn(ls, session, request)
            if shown is None:
                return (*(gr.update() for _ in link_outputs), gr.Tabs())
            return (*shown, gr.Tabs(selected="lessons"))

        def on_load(session: Session, request: gr.Request):
            token = dict(request.query_params).get("trace") if request else None
            if token:
                try:
                    session = Session.from_link(token)
                except UserError as err:
                    gr.Warning(f"could not open the link's session: {err}")
            return show(session)

        # the lesson link runs after the session's first picture, so a lesson link wins
        loaded = demo.load(on_load, [page.state], page.outs, **page.quiet).then(
            on_lesson_link, link_inputs, [*link_outputs, tabs])
        if vllm_target is not None:  # --vllm-events: every page opens on the vLLM tab
            def on_vllm_target(view: VllmView, session: Session, at: float | None,
                               request: gr.Request):
                if request is not None and dict(request.query_params).get("lesson"):
                    return tuple(gr.skip() for _ in range(len(vllm.outputs) + 1))
                return (*on_vllm_tab(view, session, at), gr.Tabs(selected="vllm"))

            loaded.then(on_vllm_target, [vllm.view, page.state, clock],
                        [*vllm.outputs, tabs], js=CLOCK_JS, **page.quiet)

        def on_unload(request: gr.Request) -> None:
            """The browser (or API client) disconnected: free the engine and its KV pool now.
            Gradio keeps a closed session's state an hour in case it reconnects; what it keeps
            of ours is then the config and op log only, and a reconnect replays the log."""
            holder = getattr(demo, "state_holder", None)
            data = holder.session_data.get(request.session_hash) if holder and request else None
            # in the log: a page whose heartbeat alone broke lives on and acts after this line
            print(f"[app] session {request.session_hash if request else '?'} ended (Gradio's "
                  f"unload): its engine and vLLM watch closed", file=sys.stderr, flush=True)
            value = data.state_data.get(page.state._id) if data is not None else None
            if isinstance(value, Session):
                value.close()
            watch = data.state_data.get(vllm.view._id) if data is not None else None
            if isinstance(watch, VllmView):  # its subscription ends with the page
                watch.close()

        demo.unload(on_unload)
        # the status line ("operation k of n", "lesson page k of n") changes with the view; the
        # picture's own change event fires whenever Plotly redraws it, and the status
        # Markdown's fires again without a change: followers answering either kept the page
        # calling the server in a loop (lessons 10 and 5), so ui/motion.js presses `follow`
        page.followers.append(Follower(tp_panel.shards_update, [page.state], [shards]))
        wire_follow(page)
    # classroom rooms: their own pages (/class, /room) and API; the registry is the app's
    # (on ZeroGPU nothing on the GPU outlives a call, so a room's long-lived engine stays on the CPU)
    demo.rooms = RoomRegistry("cpu" if ON_ZEROGPU else device)
    add_room_pages(demo, demo.rooms)
    return demo
