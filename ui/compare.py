"""The Compare tab: contiguous reservation (max / pow2 / oracle) against paging on one seeded
workload, in dry mode (bookkeeping only, so large pools are instant). Paging is measured by
admitting the same requests into a real dry engine until its pool refuses one."""

from __future__ import annotations

import gradio as gr

from engine import EngineConfig, LLMEngine
from engine.core.baselines import POLICIES, reservation_fit, workload
from lessons.helpers import admit
from ui.refusal import refused
from viz.compare_figure import admitted_figure


def compare(count: int, max_len: int, pool_tokens: int, block_size: int, seed: int):
    try:
        count, max_len, pool_tokens = int(count), int(max_len), int(pool_tokens)
        block_size, seed = int(block_size), int(seed)
        reqs = workload(count, seed, max_len)
        num_blocks = pool_tokens // block_size
        eng = LLMEngine(EngineConfig(model=None, block_size=block_size, num_gpu_blocks=num_blocks,
                                     enable_prefix_caching=False))
    except (TypeError, ValueError, OverflowError) as err:
        raise refused("compare", f"workload settings: {err}") from err
    rows = [reservation_fit(reqs, pool_tokens, p) for p in POLICIES]
    paged = admit(eng, reqs)
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
        count = gr.Number(value=200, precision=0, minimum=1, maximum=10000, label="requests")
        max_len = gr.Number(value=2048, precision=0, minimum=8, maximum=65536, label="max length")
        pool = gr.Number(value=32768, precision=0, minimum=16, maximum=1 << 20,
                         label="pool (token slots)")
        bs = gr.Dropdown([1, 4, 8, 16, 32, 64, 128], value=16, label="block size")
        seed = gr.Number(value=0, precision=0, minimum=0, label="seed")
        go_btn = gr.Button("Compare", variant="primary")
    table = gr.Markdown()
    chart = gr.Plot()
    go_btn.click(compare, [count, max_len, pool, bs, seed], [table, chart])
