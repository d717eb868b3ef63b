"""The Serving controls: add a request (n samples, beam width, max tokens, temperature) and run
the scheduler a step at a time or to the end."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from engine import SamplingParams, ops
from ui import gpu_jobs, limits, workloads
from ui.page import Page, guard, show
from ui.session import Session, UserError


def serving_panel(page: Page) -> Callable[[], None]:
    gr.Markdown("Requests go through the scheduler (continuous batching).")
    # no max_length, Gradio bounds or precision: on_add_request refuses a bad value with a message
    # naming the field (Gradio would cut, round or refuse without naming it)
    req_prompt = gr.Textbox(label="request prompt", value="Paged memory is")
    with gr.Row():
        req_n = gr.Number(value=1, label="n samples", min_width=80)
        req_beam = gr.Number(value=1, label="beam width", min_width=80)
    with gr.Row():
        req_max = gr.Number(value=16, label="max tokens", min_width=80)
        req_temp = gr.Number(value=0.0, label="temperature", min_width=80)
    with gr.Row():
        add_req = gr.Button("Add request", variant="primary", elem_id="add-request", min_width=90)
        step = gr.Button("Step", elem_id="serve-step", min_width=60)
        run_all = gr.Button("Run to the end", min_width=90)
    with gr.Row(elem_id="workload-row"):  # a mechanism at once: ui/workloads.py
        workload = gr.Dropdown(list(workloads.WORKLOADS), value=None, min_width=160, scale=3,
                               label="workload (a new session)", elem_id="workload")
        load = gr.Button("Load", min_width=60, scale=1, elem_id="load-workload")

    @guard
    def on_add_request(text, rn, rb, rm, rt, session: Session):
        if not isinstance(text, str):
            raise UserError("the request prompt must be text")
        limits.check_prompt(text, "request prompt")
        try:
            params = SamplingParams(
                max_tokens=limits.whole(rm, "max tokens", 1, limits.MAX_REQUEST_TOKENS),
                n=limits.whole(rn, "n samples", 1, limits.MAX_SAMPLES),
                beam_width=limits.whole(rb, "beam width", 1, limits.MAX_BEAM_WIDTH),
                temperature=limits.number(0 if rt is None else rt, "temperature", 0, 5),
                ignore_eos=False)
        except ValueError as err:
            raise UserError(str(err)) from err
        gpu_jobs.serve(page.gpu, session, ops.AddRequest(text, params))
        return show(session)

    # on a ZeroGPU Space, serving work too long for the CPU runs on the GPU (ui/gpu_jobs.py)
    @guard
    def on_step(session: Session):
        gpu_jobs.serve(page.gpu, session, ops.Step())
        return show(session)

    @guard
    def on_run_all(session: Session):
        gpu_jobs.run_to_end(page.gpu, session)
        return show(session)

    @guard
    def on_load(name, session: Session):
        return show(workloads.load(name, session))

    def wire() -> None:
        outs, quiet = page.outs, page.quiet
        load.click(on_load, [workload, page.state], outs, **quiet)
        add_req.click(on_add_request, [req_prompt, req_n, req_beam, req_max, req_temp, page.state],
                      outs, **quiet)
        step.click(on_step, [page.state], outs, **quiet)
        # long runs one at a time, so that the other visitors' clicks keep their turn
        run_all.click(on_run_all, [page.state], outs, concurrency_limit=1,
                      concurrency_id="long-runs", **quiet)
    return wire
