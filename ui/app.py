"""The Gradio app: Playground, Lessons, Compare and Engine tabs around one main picture.

Data flows one way: a click runs an engine operation on the session (ui/session.py), and the page
is redrawn from the new snapshot (ui/render.py -> viz/). Every refused operation becomes a
gr.Error with the engine's message; the session stays as it was.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

import gradio as gr

from classroom import RoomRegistry
from engine import EngineConfig, SamplingParams
from ui import limits, tp_panel
from ui.compare import compare_tab
from ui.gpu import ON_ZEROGPU, gpu_task
from ui.lesson_player import lessons_tab
from ui.render import render
from ui.room_pages import add_room_pages
from ui.session import Session, UserError
from viz import kv_figure

MODES = {
    "SmolLM2-135M (real model)": "default",
    "tiny random Llama (real tensors, random weights)": "tiny-random",
    "dry (bookkeeping only, no model)": None,
}
CSS = """
.presenter { font-size: 1.55em !important; line-height: 1.5 }
#pool-plot { min-height: 420px }
.nav-holder { display: none !important }  /* Gradio draws a page menu once the room pages exist */
"""
# the right-arrow key presses the lesson's Next button (for a teacher with a clicker)
HEAD = """<script>
document.addEventListener('keydown', (e) => {
  if (e.key === 'ArrowRight' && !['INPUT', 'TEXTAREA'].includes(document.activeElement.tagName)) {
    const b = document.querySelector('#lesson-next'); if (b) b.click();
  }
});
</script>"""


# Exported trace files: Gradio copies each into its own cache when it sends it, so ours are only
# needed for a moment; without pruning, every Export click of every visitor would stay on disk.
EXPORT_DIR = tempfile.mkdtemp(prefix="pagedlab-traces-")
EXPORT_MAX_AGE_S = 600


def _prune_exports() -> None:
    cutoff = time.time() - EXPORT_MAX_AGE_S
    for entry in os.scandir(EXPORT_DIR):
        try:
            if entry.stat().st_mtime < cutoff:
                os.remove(entry.path)
        except OSError:
            pass  # another session pruned it first


def _config(mode: str, block_size: Any, num_blocks: Any, prefix: bool, device: str) -> EngineConfig:
    if mode not in MODES:  # the API can send any text; it never becomes a model id or a path
        raise UserError(f"engine must be one of: {'; '.join(MODES)}")
    model = MODES[mode]
    bs = limits.whole(block_size, "block size", 1, max(limits.BLOCK_SIZES))
    most = limits.MAX_DRY_BLOCKS if model is None else limits.MAX_REAL_POOL_TOKENS // bs
    nb = limits.whole(num_blocks, "pool size (blocks)", 1, max(1, most))
    try:
        config = EngineConfig(model=model, block_size=bs, num_gpu_blocks=nb, num_cpu_blocks=nb,
                              enable_prefix_caching=bool(prefix), preemption_mode="swap",
                              device=device if model else "auto")
    except (TypeError, ValueError) as err:
        raise UserError(f"engine settings: {err}") from err
    limits.check_config(config)
    return config


def _guard(fn):
    """Turn a UserError into a gr.Error (a message box), keeping the session unchanged; on a
    ZeroGPU Space the handler runs on the GPU (ui/gpu.py)."""
    fn = gpu_task(fn)

    def wrapped(*args: Any) -> Any:
        try:
            return fn(*args)
        except UserError as err:
            raise gr.Error(str(err)) from err
        except gr.Error:
            raise
        except Exception as err:  # a bug must reach the log, and the user a sentence, not a trace
            traceback.print_exc(file=sys.stderr)
            # the op log only ever holds operations that succeeded, so Undo and Reset still work
            raise gr.Error(f"something went wrong ({type(err).__name__}); this session's "
                           "operation log is intact (Undo and Reset work); please report this") from err
    wrapped.__name__ = fn.__name__
    return wrapped


def build_app(default_mode: str = "SmolLM2-135M (real model)", device: str = "auto",
              startup_note: str = "") -> gr.Blocks:
    try:
        first = Session(_config(default_mode, 16 if MODES[default_mode] else 4,
                                64 if MODES[default_mode] else 32, True, device))
    except UserError as err:  # limits set too low for the default engine: say so at start
        raise SystemExit(f"PagedLab cannot start: {err}") from err

    # delete_cache: files Gradio cached for this app (exported traces, uploads) go after an hour
    with gr.Blocks(title="PagedLab", delete_cache=(3600, 3600)) as demo:
        # a session closed by its browser (or idle for a day) frees its engine at once
        state = gr.State(first, time_to_live=24 * 3600, delete_callback=Session.close)
        gr.Markdown("# PagedLab: watch a paged KV cache work, block by block\n" + startup_note)
        with gr.Row():
            mode = gr.Dropdown(list(MODES), value=default_mode, label="engine")
            block_size = gr.Dropdown(list(limits.BLOCK_SIZES), value=first.config.block_size,
                                     label="block size (tokens)")
            num_blocks = gr.Number(value=first.config.num_gpu_blocks, precision=0, minimum=1,
                                   maximum=limits.MAX_DRY_BLOCKS, label="pool size (blocks)")
            prefix = gr.Checkbox(value=True, label="prefix caching")
            tp = tp_panel.tp_setting()
            apply = gr.Button("Apply (new session)")
        status = gr.Markdown()
        with gr.Row():
            with gr.Column(scale=3):
                plot = gr.Plot(label="page tables → physical blocks", elem_id="pool-plot")
                shards = tp_panel.shards_plot()
                with gr.Row():
                    back = gr.Button("◀ Back")
                    nxt = gr.Button("Next ▶")
                    undo = gr.Button("Undo")
                    reset = gr.Button("Reset")
                    play = gr.Button("Play")
                    pause = gr.Button("Pause")
                    speed = gr.Slider(0.2, 3, value=1, step=0.1, label="seconds per step")
                timeline = gr.Slider(0, 1, value=0, step=1, label="timeline (operations)")
            with gr.Column(scale=2):
                metrics = gr.HTML()
                events = gr.Markdown(elem_id="event-log")
                seqs = gr.HTML()
        timer = gr.Timer(1.0, active=False)

        with gr.Tabs() as tabs:
            with gr.Tab("Playground"):
                with gr.Row():
                    prompt = gr.Textbox(label="prompt", value="Four score and seven years ago",
                                        scale=3, max_length=limits.MAX_PROMPT_CHARS)
                    as_chat = gr.Checkbox(label="as a chat message (chat template)", value=False)
                    new_seq = gr.Button("New sequence", variant="primary", elem_id="new-seq")
                with gr.Row():
                    seq = gr.Dropdown([], label="sequence", allow_custom_value=False)
                    n = gr.Number(value=1, precision=0, minimum=1, maximum=limits.MAX_APPEND,
                                  label="tokens")
                    append = gr.Button("Append n", elem_id="append")
                    fork = gr.Button("Fork", elem_id="fork")
                    free = gr.Button("Free", elem_id="free")
                gr.Markdown("**Serving**: requests go through the scheduler (continuous batching)")
                with gr.Row():
                    req_prompt = gr.Textbox(label="request prompt", value="Paged memory is", scale=3,
                                            max_length=limits.MAX_PROMPT_CHARS)
                    req_n = gr.Number(value=1, precision=0, minimum=1, maximum=limits.MAX_SAMPLES,
                                      label="n samples")
                    req_beam = gr.Number(value=1, precision=0, minimum=1, maximum=limits.MAX_BEAM_WIDTH,
                                         label="beam width")
                    req_max = gr.Number(value=16, precision=0, minimum=1,
                                        maximum=limits.MAX_REQUEST_TOKENS, label="max tokens")
                    req_temp = gr.Number(value=0.0, minimum=0, maximum=5, label="temperature")
                with gr.Row():
                    add_req = gr.Button("Add request")
                    step = gr.Button("Step")
                    run_all = gr.Button("Run to the end")
                with gr.Accordion("Trace: export, import, link", open=False):
                    with gr.Row():
                        export = gr.Button("Export trace")
                        export_file = gr.File(label="trace.json")
                        import_file = gr.File(label="import a trace", file_types=[".json"],
                                              type="binary")
                    link = gr.Textbox(label="link that reproduces this session (append to the app's URL)")
                with gr.Accordion("Block inspector (real K/V)", open=False):
                    with gr.Row():
                        block_id = gr.Number(value=0, precision=0, minimum=0, label="block id")
                        layer = gr.Number(value=0, precision=0, minimum=0, label="layer")
                        rank = tp_panel.rank_setting()
                        inspect = gr.Button("Show K/V")
                    kv_plot = gr.Plot()
            open_lesson_link = lessons_tab(device)
            compare_tab()
            with gr.Tab("Engine"):
                info = gr.JSON(label="this session's engine")

        views = [plot, events, seqs, metrics, timeline, seq, status]

        def show(session: Session) -> tuple:
            return (session, *render(session))

        @_guard
        def on_apply(m, bs, nb, pf, session, n=1):  # n (tensor parallel) last: older callers
            return show(Session(tp_panel.with_tp(_config(m, bs, nb, pf, device), n)))

        @_guard
        def on_new(text, chat, session):
            if not isinstance(text, str):
                raise UserError("the prompt must be text")
            limits.check_prompt(text)
            if chat and session.engine.runtime is not None:
                ids = session.engine.tokenizer.apply_chat_template(text)
                session.run("add_sequence", ids)
            else:
                session.run("add_sequence", text)
            return show(session)

        def _seq_id(value) -> int:
            if value in (None, ""):
                raise UserError("choose a sequence first (start one with New sequence)")
            return limits.whole(value, "the sequence id", 0, 1 << 62)

        @_guard
        def on_append(s, count, session):
            count = limits.whole(count, "tokens", 1, limits.MAX_APPEND)
            session.run("append", _seq_id(s), n=count)
            return show(session)

        @_guard
        def on_fork(s, session):
            session.run("fork", _seq_id(s))
            return show(session)

        @_guard
        def on_free(s, session):
            session.run("free", _seq_id(s))
            return show(session)

        @_guard
        def on_add_request(text, rn, rb, rm, rt, session):
            if not isinstance(text, str):
                raise UserError("the request prompt must be text")
            limits.check_prompt(text)
            try:
                params = SamplingParams(
                    max_tokens=limits.whole(rm, "max tokens", 1, limits.MAX_REQUEST_TOKENS),
                    n=limits.whole(rn, "n samples", 1, limits.MAX_SAMPLES),
                    beam_width=limits.whole(rb, "beam width", 1, limits.MAX_BEAM_WIDTH),
                    temperature=limits.number(0 if rt is None else rt, "temperature", 0, 5),
                    ignore_eos=False)
            except ValueError as err:
                raise UserError(str(err)) from err
            session.run("add_request", text, params)
            return show(session)

        @_guard
        def on_step(session):
            if not session.engine.scheduler.has_work():
                raise UserError("no request is waiting or running: add a request first")
            session.run("step")
            return show(session)

        @_guard
        def on_run_all(session):
            for _ in range(limits.MAX_RUN_STEPS):
                if not session.engine.scheduler.has_work():
                    break
                session.run("step")
            return show(session)

        @_guard
        def on_goto(pos, session):
            session.goto(limits.whole(pos, "the timeline position", 0, 1 << 62))
            return show(session)

        def on_back(session):
            session.goto(session.pos - 1)
            return show(session)

        def on_next(session):
            session.goto(session.pos + 1)
            return show(session)

        def on_undo(session):
            session.undo()
            return show(session)

        def on_reset(session):
            return show(Session(session.config))

        def on_play(session):
            return gr.Timer(active=True), session

        def on_tick(session):
            if session.pos >= len(session.ops):
                return (gr.Timer(active=False), *show(session))
            session.goto(session.pos + 1)
            return (gr.Timer(active=True), *show(session))

        def on_export(session):
            _prune_exports()
            fd, path = tempfile.mkstemp(prefix="pagedlab-trace-", suffix=".json", dir=EXPORT_DIR)
            with os.fdopen(fd, "w") as f:
                json.dump(session.export(), f, indent=1)
            return path, "?trace=" + session.to_link()

        @_guard
        def on_import(raw, session):
            if raw is None:
                return show(session)
            if not isinstance(raw, bytes):  # the upload's content only: never a path we open
                raise UserError("upload a trace file (.json)")
            return show(Session.from_bytes(raw))

        @_guard
        def on_inspect(b, lyr, r, session):
            eng = session.engine
            b = limits.whole(0 if b is None else b, "block id", 0, eng.kv.pool.num_blocks - 1)
            lyr = limits.whole(0 if lyr is None else lyr, "layer", 0, 1 << 16)
            try:
                k, v = eng.inspect_block(b, lyr, tp_panel.rank_of(r, session))
            except (ValueError, TypeError) as err:
                raise UserError(str(err)) from err
            blk = eng.snapshot().blocks[b]
            labels = [eng.decode([t]) for t in blk.token_ids]
            return kv_figure(k, v, labels, f"block {int(b)}, layer {int(lyr)}: {blk.state}, "
                             f"ref count {blk.ref_count}, {blk.num_filled} slots filled")

        def on_load(session, request: gr.Request):
            token = dict(request.query_params).get("trace") if request else None
            if token:
                try:
                    session = Session.from_link(token)
                except UserError as err:
                    gr.Warning(f"could not open the link's session: {err}")
            return show(session)

        # Progress and errors show on the status line only: by default Gradio marks every output
        # of a failed event with an "Error" badge and blanks the main figure, though a refused
        # operation changes nothing.
        on_status: dict[str, Any] = {"show_progress_on": [status]}
        outs = [state, *views]
        apply.click(on_apply, [mode, block_size, num_blocks, prefix, state, tp], outs, **on_status)
        new_seq.click(on_new, [prompt, as_chat, state], outs, **on_status)
        append.click(on_append, [seq, n, state], outs, **on_status)
        fork.click(on_fork, [seq, state], outs, **on_status)
        free.click(on_free, [seq, state], outs, **on_status)
        add_req.click(on_add_request, [req_prompt, req_n, req_beam, req_max, req_temp, state], outs,
                      **on_status)
        step.click(on_step, [state], outs, **on_status)
        run_all.click(on_run_all, [state], outs, **on_status)
        timeline.release(on_goto, [timeline, state], outs, **on_status)
        back.click(on_back, [state], outs, **on_status)
        nxt.click(on_next, [state], outs, **on_status)
        undo.click(on_undo, [state], outs, **on_status)
        reset.click(on_reset, [state], outs, **on_status)
        link_fn, link_inputs, link_outputs = open_lesson_link

        def on_lesson_link(ls, presenter_on, request: gr.Request):
            """?lesson=02_paging&step=3 opens that lesson step, in the Lessons tab."""
            shown = link_fn(ls, presenter_on, request)
            asked = request is not None and bool(dict(request.query_params).get("lesson"))
            return (*shown, gr.Tabs(selected="lessons") if asked else gr.Tabs())

        demo.load(on_lesson_link, link_inputs, [*link_outputs, tabs])
        play.click(on_play, [state], [timer, state])
        pause.click(lambda: gr.Timer(active=False), None, [timer])
        speed.change(lambda s: gr.Timer(value=float(s)), [speed], [timer])
        timer.tick(on_tick, [state], [timer, *outs], **on_status)
        export.click(on_export, [state], [export_file, link])
        import_file.upload(on_import, [import_file, state], outs, **on_status)
        inspect.click(on_inspect, [block_id, layer, rank, state], [kv_plot])
        plot.change(tp_panel.shards_update, [state], [shards])
        info_tab = next(t for t in demo.blocks.values() if isinstance(t, gr.Tab) and t.label == "Engine")
        info_tab.select(lambda s: s.engine.engine_info(), [state], [info])
        demo.load(on_load, [state], outs, **on_status)
        demo.load(lambda s: s.engine.engine_info(), [state], [info])

        def on_unload(request: gr.Request) -> None:
            """The browser (or API client) disconnected: free the engine and its KV pool now.
            Gradio keeps a closed session's state an hour in case it reconnects; what it keeps
            of ours is then the config and op log only, and a reconnect replays the log."""
            holder = getattr(demo, "state_holder", None)
            data = holder.session_data.get(request.session_hash) if holder and request else None
            value = data.state_data.get(state._id) if data is not None else None
            if isinstance(value, Session):
                value.close()

        demo.unload(on_unload)
    # classroom rooms: their own pages (/class, /room) and API; the registry is the app's
    # (on ZeroGPU nothing on the GPU outlives a call, so a room's long-lived engine stays on the CPU)
    demo.rooms = RoomRegistry("cpu" if ON_ZEROGPU else device)
    add_room_pages(demo, demo.rooms)
    return demo
