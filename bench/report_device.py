"""The README's tables for steps that stay on the device (issue 31) and the CPU tier at the speed
of the bus (issue 32), computed from the committed results of bench/device_step.py and
bench/tier.py. bench/report.py puts them under its own; a test holds the README equal to both."""

from __future__ import annotations

from collections.abc import Callable

Row = tuple[str, str, bool | None]


def _spec(rows: list[dict], batch: int, workload: str) -> dict:
    return next(r for r in rows if r["batch"] == batch and r["workload"].startswith(workload))


def device_rows(final: dict, run3: dict, run2: dict) -> list[Row]:
    """Issue 31's table: each goal with what the runs measured."""
    rows = final["spec"]["rows"]
    out: list[Row] = []
    for batch, goal in ((1, 2.0), (8, 1.5), (64, 1.0)):
        r = _spec(rows, batch, "greedy")
        out.append((f"drafts k = 4 / none, repetitive prompt, greedy, batch {batch} (≥ {goal})",
                    f"{r['drafts_over_none']:.2f}× ({r['k4']['tokens_per_s']:,.0f} vs "
                    f"{r['k0']['tokens_per_s']:,.0f} tokens/s, {r['k4']['tokens_per_pass']:.2f} "
                    f"tokens a pass, {r['k4']['kept']} of {r['k4']['drafted']} drafts kept); "
                    f"same tokens: {'yes' if r['same_tokens'] else 'no'}",
                    r["drafts_over_none"] >= goal and r["same_tokens"]))
    nothing = [_spec(rows, b, "sampled")["drafts_over_none"] for b in (1, 8, 64)]
    extra = final["spec_extra"]
    fifteen = next(v for k, v in extra.items() if k.startswith("nothing_to_draft"))
    worst = min(nothing + [fifteen["drafts_over_none"]])
    out.append(("drafts on, nothing to draft (sampled, temperature 1), batch 1 / 8 / 64 (≥ 0.97)",
                " / ".join(f"{x:.3f}" for x in nothing) + f"; batch 64 again, 15 runs each: "
                f"{fifteen['drafts_over_none']:.3f}", worst >= 0.97))
    hf = run3["hf_lookup"]["prompt_lookup_4"]["tokens_per_pass"]
    ours_async = _spec(rows, 1, "greedy")["k4"]["tokens_per_pass"]
    ours_sync = extra["sync_batch_1"]["tokens_per_pass_k4"]
    out.append(("tokens per pass against HF prompt lookup (k = 4), same model and prompt, "
                "batch 1 (≥ HF)", f"{ours_sync:.3f} with steps landing at once, {ours_async:.3f} "
                f"under async scheduling (its first drafts come two steps later); HF {hf:.3f}",
                min(ours_sync, ours_async) >= hf))
    for plen, goal in (("4096", 1.4), ("1024", 1.0)):
        h = final["hybrid"][plen]
        out.append((f"hybrid (half 128-token windows) / all full, 32 × {int(plen):,}-token prompts, "
                    f"256 new tokens, same pool bytes (≥ {goal})",
                    f"{h['hybrid_over_full']:.2f}× ({h['hybrid']['tokens_per_s']:,.0f} vs "
                    f"{h['full']['tokens_per_s']:,.0f} tokens/s); steady decode step "
                    f"{h['hybrid']['step_ms']:.2f} vs {h['full']['step_ms']:.2f} ms, its graph "
                    f"{h['hybrid']['graph_gpu_ms']:.2f} vs {h['full']['graph_gpu_ms']:.2f} ms",
                    h["hybrid_over_full"] >= goal))
    for n in ("64", "256"):
        a, b = run3["roofline"][n], run2["roofline"][n]
        out.append((f"1.2B decode step / HBM roofline, {n} sequences, context 512 (≤ 1.3)",
                    f"{a['async_over_roofline']:.2f}× and {b['async_over_roofline']:.2f}× in two "
                    f"runs (step {a['async_step_ms']:.2f} / {b['async_step_ms']:.2f} ms, its graph "
                    f"alone {a['graph_over_roofline']:.2f}× / {b['graph_over_roofline']:.2f}×, "
                    f"roofline {a['roofline_ms']:.2f} ms)",
                    max(a["async_over_roofline"], b["async_over_roofline"]) <= 1.3))
    a, b = run3["roofline"]["256"], run2["roofline"]["256"]
    out.append(("host time of a steady 256-sequence decode step, 1.2B (under the GPU's)",
                f"{a['host_ms_per_step']:.2f} and {b['host_ms_per_step']:.2f} ms (the synchronous "
                f"step less its graph) against {a['graph_gpu_ms']:.2f} and "
                f"{b['graph_gpu_ms']:.2f} ms of graph",
                a["host_ms_per_step"] < a["graph_gpu_ms"] and b["host_ms_per_step"] < b["graph_gpu_ms"]))
    return out


def tier_rows(final: dict, bandwidth_runs: list[dict]) -> list[Row]:
    """Issue 32's table."""
    bw = [r["bandwidth"] for r in bandwidth_runs]
    out: list[Row] = [(
        "tier copies, GPU → CPU and CPU → GPU, 128 blocks of "
        f"{bw[0]['slot_bytes'] // 1024} KiB (Llama-1B shape) (≥ 35 GB/s each way)",
        ", ".join(f"{b['gpu_to_cpu_gb_s']:.1f} / {b['cpu_to_gpu_gb_s']:.1f}" for b in bw)
        + f" GB/s in {len(bw)} runs; bytes back equal: "
        + ("yes" if all(b["same_bytes_back"] for b in bw) else "no"),
        all(min(b["gpu_to_cpu_gb_s"], b["cpu_to_gpu_gb_s"]) >= 35 for b in bw))]
    labels: dict[str, tuple[str, float]] = {
        "llama1b_2052": ("repeat of a 2,052-token prompt after eviction, tier / recompute, "
                         "Llama-1B shape", 2.0),
        "smollm2_2052": ("the same, SmolLM2 shape", 2.0),
        "llama1b_4096_document": ("the same, a 4,096-token document, Llama-1B shape", 4.0)}
    for key, (label, goal) in labels.items():
        r = final["repeat"][key]
        same: Callable[[bool], str] = lambda s: "yes" if s else "no (bf16: another chunking)"
        out.append((f"{label} (≥ {goal})", f"{r['recompute_over_tier']:.2f}× "
                    f"({r['tier']['median_ms']:.1f} vs {r['recompute']['median_ms']:.1f} ms); "
                    f"same first tokens: {same(r['same_first_tokens'])}",
                    r["recompute_over_tier"] >= goal))
    o = final["overlap"]
    out.append(("tokens/s of 32 decoding requests in the step a load is issued, against steps "
                "without (≥ 0.9)", f"{o['tokens_per_s_with_load_over_without']:.2f}× (step "
                f"{o['load_step_ms']:.2f} vs {o['quiet_step_ms']:.2f} ms; "
                f"{o['steps_with_a_load']} loads of 128 blocks)",
                o["tokens_per_s_with_load_over_without"] >= 0.9))
    return out
