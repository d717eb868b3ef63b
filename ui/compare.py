"""The Compare tab: contiguous reservation (max / pow2 / oracle) against paging on one seeded
workload, in dry mode (bookkeeping only, so large pools are instant). Paging is measured by
admitting the same requests into a real dry engine until its pool refuses one."""

from __future__ import annotations

import gradio as gr

from engine import EngineConfig, LLMEngine
from engine.describe.baselines import POLICIES, reservation_fit, workload
from lessons.helpers import admit
from ui.limits import UserError, whole
from ui.refusal import refused
from viz.compare_figure import admitted_figure


def compare(count: int, max_len: int, pool_tokens: int, block_size: int, seed: int):
    try:
        count = whole(count, "requests", 1, 10000)
        max_len = whole(max_len, "max length", 8, 65536)
        block_size = whole(block_size, "block size", 1, 128)
        pool_tokens = whole(pool_tokens, "pool (token slots)", block_size, 1 << 20)
        seed = whole(seed, "seed", 0, 2**31 - 1)
    except UserError as err:
        raise refused("compare", str(err)) from err
    reqs = workload(count, seed, max_len)
    eng = LLMEngine(EngineConfig(model=None, block_size=block_size,
                                 num_gpu_blocks=pool_tokens // block_size, enable_prefix_caching=False))
    rows = [reservation_fit(reqs, pool_tokens, p) for p in POLICIES]
    paged = admit(eng.apply, reqs)
    snap = eng.snapshot()
    used = snap.metrics.num_tokens
    held = snap.metrics.used_blocks * block_size
    rows.append({"policy": f"paged (block {block_size})", "admitted": paged, "reserved": held,
                 "used": used, "utilization": used / held if held else 0.0})
    table = ("| allocator | requests admitted | slots held | slots with tokens | utilization |\n"
             "|---|---|---|---|---|\n")
    table += "\n".join(f"| {r['policy']} | {r['admitted']} | {r['reserved']} | {r['used']} | "
                       f"{r['utilization']:.1%} |" for r in rows)
    return table, admitted_figure(rows, pool_tokens)


def compare_tab() -> None:
    """The Compare controls and results, inside the tab the page gives them."""
    gr.Markdown("Contiguous reservation against paging, on the same requests (dry engine).")
    with gr.Row():
        count = gr.Number(value=200, label="requests")
        max_len = gr.Number(value=2048, label="max length")
        pool = gr.Number(value=32768, label="pool (token slots)")
        bs = gr.Dropdown([1, 4, 8, 16, 32, 64, 128], value=16, label="block size")
        seed = gr.Number(value=0, label="seed")
        go_btn = gr.Button("Compare", variant="primary")
    table = gr.Markdown()
    chart = gr.Plot()
    go_btn.click(compare, [count, max_len, pool, bs, seed], [table, chart])
