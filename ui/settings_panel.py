"""The Settings tab: which engine (real model, tiny random model, dry), block size, pool size,
prefix caching (Apply starts a new session); exporting / importing a trace and the link that
reproduces the session; and the engine's description."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import gradio as gr

from engine import EngineConfig
from ui import limits, tp_panel
from ui.page import Page, guard, show
from ui.session import Session, UserError

MODES = {
    "SmolLM2-135M (real model)": "default",
    "tiny random Llama (real tensors, random weights)": "tiny-random",
    "tiny hybrid: full + 32-token sliding-window layers (random weights)": "tiny-hybrid",
    "dry (bookkeeping only, no model)": None,
}
if limits.EXTRA_MODEL:  # python app.py --model NAME_OR_PATH
    MODES[f"{limits.EXTRA_MODEL} (--model)"] = limits.EXTRA_MODEL

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


def engine_config(mode: str, block_size: Any, num_blocks: Any, prefix: bool, device: str) -> EngineConfig:
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


#: the draft lengths the Settings offer (0: speculative decoding off)
DRAFT_CHOICES = (0, 2, 4, 8)


def with_drafts(config: EngineConfig, k: Any) -> EngineConfig:
    """The config with prompt-lookup speculative decoding of up to k draft tokens (0: off)."""
    k = limits.whole(0 if k is None else k, "draft tokens", 0, max(DRAFT_CHOICES))
    if not k:
        return config
    return dataclasses.replace(config, speculative_method="ngram", num_speculative_tokens=k)


def settings_panel(page: Page, first: Session, default_mode: str) -> Callable[[], None]:
    mode = gr.Dropdown(list(MODES), value=default_mode, label="engine")
    with gr.Row():
        block_size = gr.Dropdown(list(limits.BLOCK_SIZES), value=first.config.block_size,
                                 label="block size (tokens)", min_width=90)
        num_blocks = gr.Number(value=first.config.num_gpu_blocks, label="pool size (blocks)",
                               min_width=90)  # no Gradio bounds: the check names the field
    tp = tp_panel.tp_setting()
    spec = gr.Dropdown(list(DRAFT_CHOICES), value=0, min_width=90,
                       label="speculative decoding (draft tokens)",
                       info="0 = off; a prompt lookup guesses up to this many (lesson 12)")
    with gr.Row():
        prefix = gr.Checkbox(value=True, label="prefix caching", min_width=100)
        apply = gr.Button("Apply (new session)", min_width=100)
    with gr.Accordion("Trace: export, import, link", open=False):
        export = gr.Button("Export trace")
        export_file = gr.File(label="trace.json")
        import_file = gr.File(label="import a trace", file_types=[".json"], type="binary")
        link = gr.Textbox(label="link that reproduces this session (append to the app's URL)")
    with gr.Accordion("This session's engine", open=False) as info_box:
        info = gr.JSON(label="engine")

    @guard
    def on_apply(m, bs, nb, pf, session: Session, n=1, k=0):
        config = with_drafts(tp_panel.with_tp(engine_config(m, bs, nb, pf, page.device), n), k)
        return show(session.fresh(config))

    def on_export(session: Session):
        _prune_exports()
        fd, path = tempfile.mkstemp(prefix="pagedlab-trace-", suffix=".json", dir=EXPORT_DIR)
        with os.fdopen(fd, "w") as f:
            json.dump(session.export(), f, indent=1)
        return path, "?trace=" + session.to_link()

    @guard
    def on_import(raw, session: Session):
        if raw is None:
            return show(session)
        if not isinstance(raw, bytes):  # the upload's content only: never a path we open
            raise UserError("upload a trace file (.json)")
        return show(Session.from_bytes(raw))

    def wire() -> None:
        outs, quiet = page.outs, page.quiet
        apply.click(on_apply, [mode, block_size, num_blocks, prefix, page.state, tp, spec], outs,
                    **quiet)
        export.click(on_export, [page.state], [export_file, link])
        import_file.upload(on_import, [import_file, page.state], outs, **quiet)
        info_box.expand(lambda s: s.engine.engine_info(), [page.state], [info])
    return wire
