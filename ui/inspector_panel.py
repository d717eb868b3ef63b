"""The block inspector (a block's real K/V in one layer) and the picture's clicks.

A click on the picture arrives as text in a hidden textbox ("block:7|<time>" or "seq:2|<time>",
set by ui/motion.js) and a press of a hidden button: a block click selects the block (outlined,
its table links drawn dark) and opens the inspector on it; a sequence click selects the
sequence for Append / Fork / Free. The block-id box and Show K/V are the keyboard path.

The inspector follows its block: whenever the picture changes (any operation, Back, Next, the
timeline), the note and the K/V figure are written again from the block's state now, so a block
freed or cached since the click is described as free or cached, not as its old owner's.

It always reads the engine in the state the picture shows, whichever run is in front
(ui/front.py): the session's engine at its cursor, or a lesson's at its page, each moved there
by its run's history from a checkpoint near it. A block that holds no K/V (free, or a CPU block)
gets a sentence, not a figure. The inspector opens over the column beside the picture
(ui/theme.py)."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr

from ui import limits, tp_panel
from ui.front import Front, front
from ui.page import SCRIPTED, Follower, Page, guard, show
from ui.session import Session, UserError
from viz import kv_figure

PAST_NOTE = ("\n\n_Press **Show K/V** to see this block's bytes here (the engine is rebuilt at "
             "this point of the log if it is elsewhere)._")
DRY_NOTE = "\n\n_Dry mode holds no K/V tensors: choose a real model in Settings to see them._"
NO_KV = ("\n\n_No K/V to show: no token has been written into this block since it was last "
         "given out, so nothing the engine will read is in it._")
CPU_NOTE = {"cpu": ("**CPU block c{b}** (swap space): {what}. The inspector reads GPU blocks: "
                    "a swapped request's K/V come back into a GPU block when it is swapped in."),
            "tier": ("**CPU tier slot t{b}**: {what}. The inspector reads GPU blocks: a prefix "
                     "hit on this slot copies its K/V back into a GPU block (lesson 14).")}


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


def kv_view(eng, snap, decode, b: int, layer: int, rank=None) -> tuple[str, object]:
    """(note, K/V figure) of block `b` as `snap` shows it, its bytes read from `eng`, which must
    be in that state (a block whose tokens differ there is refused, never shown)."""
    summary = describe_block(snap, decode, snap.block_size, b)
    blk = snap.blocks[b]
    if blk.num_filled == 0:
        return summary + NO_KV, None
    if tuple(eng.snapshot().blocks[b].token_ids) != tuple(blk.token_ids):
        raise RuntimeError(f"the engine read for block {b} is not in the state the picture shows")
    try:
        k, v = eng.inspect_block(b, layer, rank)
    except (ValueError, TypeError) as err:
        raise UserError(str(err)) from err
    labels = [decode([t]) for t in blk.token_ids]
    return summary, kv_figure(k, v, labels, f"block {b}, layer {layer}: {blk.state}, ref count "
                                            f"{blk.ref_count}, {blk.num_filled} slots filled")


def shown_block(shown: Front, b: int, layer: int | None = None) -> tuple[str, object]:
    """Block `b` of the run in front, as its picture shows it: its note and its K/V (its first
    layer unless `layer`), read from that run's engine in that state."""
    snap = shown.snapshot()
    if snap is None:
        return "Press Start: the lesson's engine is not running yet.", None
    if not 0 <= b < snap.num_blocks:
        return f"Block {b} is not in this pool of {snap.num_blocks} blocks.", None
    if shown.dry:  # bookkeeping only, no tensors to show
        return describe_block(snap, shown.decode, snap.block_size, b) + DRY_NOTE, None
    layer = block_layer(snap, b) if layer is None else layer
    return kv_view(shown.engine_here(), snap, shown.decode, b, layer)


def cpu_block(snap, decode, where: str, b: int) -> str:
    """A sentence on a CPU block (swap space) or a CPU tier slot, which the inspector does not read."""
    blocks = snap.cpu_blocks if where == "cpu" else snap.tier_blocks
    if not 0 <= b < len(blocks):
        return f"There is no {'CPU block' if where == 'cpu' else 'tier slot'} {b}."
    blk = blocks[b]
    if blk.state == "free" or not blk.token_ids:
        what = "free"
    else:
        text = decode(list(blk.token_ids)).replace("`", "'").replace("\n", " ")[:80]
        owner = f" of {', '.join(f'seq {o}' for o in blk.owners)}" if blk.owners else ""
        what = f"holds {blk.num_filled} tokens{owner}: `{text}`"
    return CPU_NOTE[where].format(b=b, what=what)


def inspector_panel(page: Page) -> Callable[[], None]:
    click_box = gr.Textbox(elem_id="pl-click", elem_classes=["pl-hidden"], show_label=False,
                           container=False)
    click_go = gr.Button("picture click", elem_id="pl-click-go", elem_classes=["pl-hidden"])
    with gr.Accordion("Block inspector (real K/V): click a block", open=False,
                      elem_id="inspector") as box:
        note = gr.Markdown(elem_id="inspector-note")
        kv_plot = gr.Plot(show_label=False, elem_id="kv-plot")  # first: beside the picture
        with gr.Row():
            # no Gradio bounds or precision: on_inspect's check names the field
            block_id = gr.Number(value=0, label="block id", min_width=70)
            layer = gr.Number(value=0, label="layer", min_width=70)
            rank = tp_panel.rank_setting()
            inspect = gr.Button("Show K/V", min_width=80)

    @guard
    def on_inspect(b, lyr, session: Session, r=None):
        """Show K/V: block `b` in layer `lyr` of the engine the picture shows."""
        shown = front(session)
        snap = shown.snapshot()
        if snap is None:
            return "Press Start: the lesson's engine is not running yet.", None
        b = limits.whole(0 if b is None else b, "block id", 0, snap.num_blocks - 1)
        lyr = limits.whole(0 if lyr is None else lyr, "layer", 0, 1 << 16)
        if shown.dry:  # a press of Show K/V asks for tensors the dry mode has not
            raise UserError("the dry mode has no K/V tensors to inspect; load a model")
        eng = shown.engine_here()
        return kv_view(eng, snap, shown.decode, b, lyr, tp_panel.rank_of(r, eng))

    @guard
    def on_click(value, session: Session):
        what, _, rest = str(value or "").partition(":")
        target = rest.partition("|")[0]
        keep = (gr.update(), gr.update(), gr.update(), gr.update())
        shown = front(session)
        snap = shown.snapshot()
        if snap is None or not target.isdigit():
            return (*show(session), *keep)
        if what in ("cpu", "tier"):
            return (*show(session), gr.update(open=True), cpu_block(snap, shown.decode, what,
                                                                     int(target)), gr.update(), None)
        if what == "seq":
            shown.select_seq(int(target))
            return (*show(session), *keep)
        if what != "block" or int(target) >= snap.num_blocks:
            return (*show(session), *keep)
        b = int(target)
        shown.selected_block = b
        summary, figure = shown_block(shown, b)
        return (*show(session), gr.update(open=True), summary, b, figure)

    def on_follow(lyr, session: Session, r=None):
        """The view changed: describe the selected block as it is now (the run in front, as its
        picture shows it); its K/V where the engine is there without moving it (Back / Next draw
        recorded frames: no engine work)."""
        shown = front(session)
        b, snap = shown.selected_block, shown.snapshot()
        if b is None or snap is None or not 0 <= b < snap.num_blocks:
            return gr.update(), gr.update()
        summary = describe_block(snap, shown.decode, snap.block_size, b)
        if shown.dry:
            return summary + DRY_NOTE, None
        if not shown.engine_ready():
            return summary + PAST_NOTE, None
        try:
            return on_inspect(b, lyr, session, r)
        except gr.Error:  # e.g. a layer box left out of range: keep the note, drop the figure
            return summary, None

    def wire() -> None:
        inspect.click(on_inspect, [block_id, layer, page.state, rank], [note, kv_plot])
        # the status line, not the picture: see the shards picture in ui/app.py
        page.followers.append(Follower(on_follow, [layer, page.state, rank], [note, kv_plot]))
        click_go.click(on_click, [click_box, page.state],
                       [*page.outs, box, note, block_id, kv_plot], **page.quiet, **SCRIPTED)
    return wire
