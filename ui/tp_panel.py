"""The app's tensor-parallel pieces: the setting, the shards picture, the inspector's rank.

Kept out of ui/app.py, which only places these components and wires them with a few lines.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gradio as gr

from engine import EngineConfig
from ui import limits
from ui.front import front
from ui.limits import UserError
from viz.shards_figure import shards_figure

CHOICES = [1, 3]  # the default model's 3 KV heads split into 1 or 3 ranks


def tp_setting(value: int = 1) -> gr.Dropdown:
    return gr.Dropdown(CHOICES, value=value, label="tensor parallel (worker processes)",
                       info="3 ranks each hold 1 of the 3 KV heads (real model only)")


def with_tp(config: EngineConfig, size: Any) -> EngineConfig:
    """`config` with `size` worker processes, refused with a message where it cannot run."""
    n = limits.whole(1 if size in (None, "") else size, "tensor parallel size", 1,
                     max(limits.TP_SIZES))
    if n == 1:
        return config
    if config.dry:
        raise UserError("tensor parallelism splits a model over worker processes; the dry mode "
                        "has no model: choose the real model")
    try:
        config = dataclasses.replace(config, tensor_parallel_size=n)
    except ValueError as err:
        raise UserError(f"engine settings: {err}") from err
    limits.check_config(config)
    return config


def shards_plot() -> gr.Plot:
    # the figure's title names it: Gradio's label would sit on top of that title
    return gr.Plot(label="tensor parallelism: one block table, N pools", show_label=False,
                   visible=False, elem_id="shards-plot")


def shards_update(session: Any) -> Any:
    """The shards picture for the run in front of the picture (the session's, or a lesson's);
    hidden without tensor parallelism."""
    shown = front(session).shards()
    if shown is None:
        return gr.update(visible=False)
    return gr.update(value=shards_figure(*shown), visible=True)


def rank_setting() -> gr.Number:
    return gr.Number(value=None, label="rank (empty: all ranks)")  # rank_of names the field


def rank_of(value: Any, session: Any) -> int | None:
    if value in (None, ""):
        return None
    return limits.whole(value, "rank", 0, session.config.tensor_parallel_size - 1)
