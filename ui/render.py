"""Session -> what the page shows (figures and panels), as one tuple for the Gradio outputs:
(picture, events, sequences, metrics, timeline, sequence dropdown, status)."""

from __future__ import annotations

import os
from typing import Any

import gradio as gr

from ui.hints import next_move
from ui.picture_split import fit_split
from ui.run_views import request_blocks, seq_labels
from ui.session import Session
from viz import event_log_markdown, metrics_html, pool_figure, sequences_html
from viz.requests_panel import added_requests, requests_html

#: how the status line names the built-in models (an HF id or a folder is named as it was given)
MODEL_NAMES = {"default": "SmolLM2-135M-Instruct", "tiny-random": "tiny random Llama",
               "tiny-hybrid": "tiny hybrid Qwen2 (full + sliding-window layers)"}


def model_status(config: Any) -> str:
    """The status line's first part: the model by a name a person knows, or the dry mode."""
    if config.dry:
        return "dry mode: bookkeeping only, no model"
    name = MODEL_NAMES.get(config.model, config.model)
    if os.path.isabs(str(name)) or os.path.isdir(str(name)):  # a folder: its name, not the path
        name = os.path.basename(str(name).rstrip("/\\")) or name
    ranks = getattr(config, "tensor_parallel_size", 1)
    return f"model: {name}" + (f" on {ranks} ranks" if ranks > 1 else "")


def token_text(engine: Any) -> Any:
    return lambda t: engine.decode([t])


def texts_html(session: Session, view: Any) -> str:
    """The serving requests (every one since it was added, finished ones with their samples'
    or beams' text and scores), then each live sequence's tokens."""
    snap = view.snapshot
    served = requests_html(list(view.requests), list(view.finished), snap, session.decode,
                           added_requests(session.ops[: session.pos]))
    if served and not snap.sequences:
        return served
    return served + sequences_html(snap, token_text(session))


def _chosen(session: Session, snap: Any) -> int | None:
    """The sequence outlined and acted on: the one picked, else the newest."""
    chosen = session.selected_seq if session.selected_seq in snap.sequences else None
    if chosen is None and snap.sequences:
        chosen = int(list(snap.sequences)[-1])
    return chosen


def pool_at(session: Session, box: tuple[int, int] | None) -> Any:
    """The main picture at the session's cursor, fitted to `box`. Serving's sequences are named
    by their requests ("req 3 · beam 1 (seq 7)"), a request selected in the timeline outlined."""
    view = session.frame()
    snap = view.snapshot
    events = list(view.events) if session.pos else []
    block = session.selected_block
    if block is not None and not 0 <= block < snap.num_blocks:
        block = None
    return pool_figure(snap, events, session.decode, selected_seq=_chosen(session, snap),
                       selected_block=block, large=session.presenter, box=box,
                       seq_labels=seq_labels(view.requests, view.timeline) or None,
                       lit=request_blocks(view.requests, session.selected_request))


def session_fit(session: Session) -> tuple[Any, tuple[int, int] | None]:
    """(the main picture, the box of the view under it; None: no view) at the session's
    cursor: the two share the page's box (ui/picture_split.py)."""
    key = (session.pos, len(session.ops), id(session.frame()),
           session.presenter, session.selected_seq, session.selected_block,
           session.selected_request)
    return fit_split(session.fits, key, session.box, session.view_choice, lambda box: pool_at(session, box))


def session_figure(session: Session) -> Any:
    """The main picture at the session's cursor, fitted to the page's box for it."""
    return session_fit(session)[0]


def render(session: Session) -> tuple:
    """The page at the session's cursor, from the view recorded there (no engine work on Back,
    Next or the timeline)."""
    view = session.frame()
    snap = view.snapshot
    events = list(view.events) if session.pos else []
    live = [str(s) for s in snap.sequences]
    chosen = _chosen(session, snap)
    fig = session_figure(session)
    timeline = gr.update(maximum=max(1, len(session.ops)), value=session.pos)
    seq_choice = gr.update(choices=live, value=str(chosen) if chosen is not None else None)
    where = f"operation {session.pos} of {len(session.ops)}"
    mode = model_status(session.config)
    hint = f"**Try next:** {next_move(snap, events, chosen)}\n\n"
    return (fig, hint + event_log_markdown(events), texts_html(session, view),
            metrics_html(snap, view.info, view.max_model_len), timeline, seq_choice,
            f"{mode} · {where}")
