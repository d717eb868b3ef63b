"""The block inspector (a block's real K/V in one layer) and the picture's clicks.

A click on the picture arrives as text in a hidden textbox ("block:7|<time>" or "seq:2|<time>",
set by ui/motion.js) and a press of a hidden button: a block click selects the block (outlined,
its table links drawn dark) and opens the inspector on it; a sequence click selects the
sequence for Append / Fork / Free. The block-id box and Show K/V are the keyboard path.

The inspector follows its block: whenever the picture changes (any operation, Back, Next, the
timeline), the note and the K/V figure are written again from the block's state now, so a block
freed or cached since the click is described as free or cached, not as its old owner's."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from ui import limits, tp_panel
from ui.page import Page, guard, show
from ui.session import Session, UserError
from viz import kv_figure

PAST_NOTE = ("\n\n_An earlier point of the log: press **Show K/V** to see this block's bytes "
             "then (the engine goes back to this point from its nearest checkpoint)._")
DRY_NOTE = "\n\n_Dry mode holds no K/V tensors: choose a real model in Settings to see them._"


def block_summary(session: Session, b: int) -> str:
    """The inspector's note on block `b` as it is now."""
    return describe_block(session.view().snapshot, session.decode, session.config.block_size, b)


def describe_block(snap, decode, size: int, b: int) -> str:
    """A block's state in words, from a snapshot."""
    blk = snap.blocks[b]
    text = decode(list(blk.token_ids)) if blk.token_ids else ""
    shown = text.replace("`", "'").replace("\n", " ")[:120]
    contents = f": `{shown}`" if shown else ""
    if blk.state == "free":
        return (f"**Block {b}**: free: no sequence holds it (ref count 0); it waits in the free "
                f"queue for the next allocation")
    if blk.state == "cached":
        return (f"**Block {b}**: cached: no sequence holds it (ref count 0), but what it holds "
                f"stays in the prefix cache until a prompt with the same start reuses it or the "
                f"block is evicted{contents}")
    owners = ", ".join(f"seq {o}" for o in blk.owners) or "no sequence"
    return (f"**Block {b}**: {blk.state}, ref count {blk.ref_count}, held by {owners}; "
            f"{blk.num_filled} of {size} slots filled{contents}")


def block_layer(snap, b: int, layer: int = 0) -> int:
    """`layer` if block b's page holds it, else the first layer it holds (a hybrid model's
    block holds its KV cache group's layers only)."""
    group = next((g for g in snap.kv_cache_groups if g.name == snap.blocks[b].group), None)
    if group is None or not group.layers or layer in group.layers:
        return layer
    return group.layers[0]


def lesson_block(ls, b: int) -> tuple[str, object]:
    """A click on block `b` while a lesson is in front: its note and its K/V in its first layer,
    read from the lesson's engine."""
    run = getattr(ls, "run", None)
    if run is None:
        return "Press Start: the lesson's engine is not running yet.", None
    eng = run.engine
    snap = run.shown_snapshot
    if not 0 <= b < snap.num_blocks:
        return f"Block {b} is not in this lesson's pool of {snap.num_blocks} blocks.", None
    summary = describe_block(snap, eng.decode, snap.block_size, b)
    if eng.config.dry:
        return summary + DRY_NOTE, None
    layer = block_layer(snap, b)
    k, v = eng.inspect_block(b, layer)
    blk = snap.blocks[b]
    labels = [eng.decode([t]) for t in blk.token_ids]
    return summary, kv_figure(k, v, labels, f"block {b}, layer {layer}: {blk.state}, ref count "
                                            f"{blk.ref_count}, {blk.num_filled} slots filled")


def inspector_panel(page: Page) -> Callable[[], None]:
    click_box = gr.Textbox(elem_id="pl-click", elem_classes=["pl-hidden"], show_label=False,
                           container=False)
    click_go = gr.Button("picture click", elem_id="pl-click-go", elem_classes=["pl-hidden"])
    with gr.Accordion("Block inspector (real K/V): click a block", open=False,
                      elem_id="inspector") as box:
        note = gr.Markdown(elem_id="inspector-note")
        with gr.Row():
            # no Gradio bounds or precision: on_inspect's check names the field
            block_id = gr.Number(value=0, label="block id", min_width=70)
            layer = gr.Number(value=0, label="layer", min_width=70)
            rank = tp_panel.rank_setting()
            inspect = gr.Button("Show K/V", min_width=80)
        kv_plot = gr.Plot(show_label=False, elem_id="kv-plot")

    @guard
    def on_inspect(b, lyr, session: Session, r=None):
        eng = session.engine
        b = limits.whole(0 if b is None else b, "block id", 0, eng.pool_size() - 1)
        lyr = limits.whole(0 if lyr is None else lyr, "layer", 0, 1 << 16)
        try:
            k, v = eng.inspect_block(b, lyr, tp_panel.rank_of(r, session))
        except (ValueError, TypeError) as err:
            raise UserError(str(err)) from err
        blk = eng.snapshot().blocks[b]
        labels = [eng.decode([t]) for t in blk.token_ids]
        return kv_figure(k, v, labels, f"block {int(b)}, layer {int(lyr)}: {blk.state}, "
                         f"ref count {blk.ref_count}, {blk.num_filled} slots filled")

    @guard
    def on_click(value, session: Session, ls=None):
        what, _, rest = str(value or "").partition(":")
        target = rest.partition("|")[0]
        keep = (gr.update(), gr.update(), gr.update(), gr.update())
        if session.lesson_front:  # the picture shows a lesson's engine: inspect its blocks
            unchanged = tuple(gr.update() for _ in page.outs)
            if what != "block" or not target.isdigit():
                return (*unchanged, *keep)
            summary, figure = lesson_block(ls, int(target))
            return (*unchanged, gr.update(open=True), summary, int(target), figure)
        if what == "seq" and target.isdigit() and int(target) in session.view().snapshot.sequences:
            session.selected_seq = int(target)
            return (*show(session), *keep)
        if what != "block" or not target.isdigit() or int(target) >= session.config.num_gpu_blocks:
            return (*show(session), *keep)
        b = int(target)
        session.selected_block = b
        summary = block_summary(session, b)
        if session.config.dry:  # dry mode: bookkeeping only, no tensors to show
            figure = None
            summary += DRY_NOTE
        else:
            figure = on_inspect(b, block_layer(session.view().snapshot, b), session)
        return (*show(session), gr.update(open=True), summary, b, figure)

    def on_follow(lyr, session: Session, r=None):
        """The view changed: describe the selected block as it is now (nothing if no block
        is selected or a lesson's engine is in front)."""
        b = session.selected_block
        if session.lesson_front or b is None or not 0 <= b < session.view().snapshot.num_blocks:
            return gr.update(), gr.update()
        summary = block_summary(session, b)
        if session.config.dry:
            return summary + DRY_NOTE, None
        if not session.engine_ready:  # Back / Next draw recorded views: no engine work for K/V
            return summary + PAST_NOTE, None
        try:
            return summary, on_inspect(b, lyr, session, r)
        except gr.Error:  # e.g. a layer box left out of range: keep the note, drop the figure
            return summary, None

    def wire() -> None:
        inspect.click(on_inspect, [block_id, layer, page.state, rank], [kv_plot])
        # the status line, not the picture: see the shards picture in ui/app.py
        page.status.change(on_follow, [layer, page.state, rank], [note, kv_plot],
                           show_progress="hidden")
        click_go.click(on_click, [click_box, page.state, page.lesson],
                       [*page.outs, box, note, block_id, kv_plot], **page.quiet)
    return wire
