"""The README's table for issue 43 (two GPUs that pay), computed from the committed result of
bench/tp_gpu.py (`bench/results/tp_gpu_h100x2.json`). bench/report.py puts it under its own.
A figure the run did not reach (its part's budget ran out) is taken from the run before it, named
so in the row: each row says which run measured it."""

from __future__ import annotations

from typing import Any

Row = tuple[str, str, bool | None]


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _x(v: Any) -> str:
    return f"{v:.2f}×" if isinstance(v, int | float) else "not measured"


def _ratio_row(label: str, ratio: Any, a: Any, b: Any, unit: str, goal: float, low: bool) -> Row:
    met = None if ratio is None else (ratio <= goal if low else ratio >= goal)
    return (f"{label} ({'≤' if low else '≥'} {goal})", f"{_x(ratio)} ({a} vs {b} {unit})", met)


def tp_rows(r: dict[str, Any], earlier: dict[str, Any] | None = None,
            earlier_name: str = "run 1") -> list[Row]:
    """Issue 43's goals with what the run measured (`earlier`: the run before, named
    `earlier_name`, for what it missed)."""
    out = _rows(r)
    if earlier is None:
        return out
    before = _rows(earlier)
    return [(label, f"{was} ({earlier_name})", met_was) if met is None and met_was is not None else
            (label, value, met) for (label, value, met), (_, was, met_was) in zip(out, before, strict=True)]


def _rows(r: dict[str, Any]) -> list[Row]:
    f, parts = r["figures"], r["parts"]
    small, big = _get(parts, "small", "runs") or {}, _get(parts, "big", "runs") or {}
    out: list[Row] = []
    for mode in ("sync", "async"):
        out.append(_ratio_row(
            f"TinyLlama-1.1B shape, 32 sequences: TP = 2 decode step / TP = 1 graphed, {mode}",
            f[f"small_tp2_over_tp1_decode_step_{mode}"],
            _get(small, f"tp2_{mode}", "median_decode_step_ms"),
            _get(small, f"tp1_{mode}", "median_decode_step_ms"), "ms", 1.0, True))
    for mode in ("async", "sync"):
        out.append(_ratio_row(
            f"Llama-3-8B shape, 64 × (256 + 64) tokens: tokens/s TP = 2 / TP = 1, {mode}",
            f[f"big_tp2_over_tp1_tokens_per_s_{mode}"],
            _get(big, f"tp2_{mode}", "tokens_per_s"), _get(big, f"tp1_{mode}", "tokens_per_s"),
            "tokens/s", 1.5, False))
    h = f["small_tp2_sync_host_ms"]
    out.append(("1.1B TP = 2 graph per step on the GPU / one GPU's graph",
                f"{h.get('graph_gpu')} / {h.get('tp1_graph_gpu')} ms", None))
    for name, label in (("small", "1.1B"), ("big", "8B")):
        h = f[f"{name}_tp2_sync_host_ms"]
        host = None if None in (h["engine"], h["worker0_to_launch"]) else \
            h["engine"] + h["worker0_to_launch"]
        out.append((f"host time of a TP = 2 decode step under its GPU time, {label}, sync",
                    f"{host if host is None else round(host, 3)} ms (engine {h['engine']}, worker 0 "
                    f"to launch {h['worker0_to_launch']}) against a graph of {h['graph_gpu']} ms",
                    None if host is None or h["graph_gpu"] is None else host < h["graph_gpu"]))
    eq = [f["float32_tp2_sync_equal"], f["float32_tp2_async_equal"]]
    shown = " / ".join("not measured" if e is None else e for e in eq)
    out.append(("float32 greedy, TP = 2 against TP = 1 (sync / async)", shown,
                None if None in eq else all(_all_equal(e) for e in eq)))
    sent = _get(small, "tp2_sync", "message_bytes_per_decode_step")
    out.append(("bytes to the workers per decode step, 1.1B, 32 sequences (was 1,455)",
                f"median {_get(sent, 'median')}, at most {_get(sent, 'max')}", None))
    tests = f["pytest"]
    out.append(("GPU tests (tests/engine/tp/test_tp_gpu.py)", tests or "not run",
                None if tests is None else
                "passed" in tests and "failed" not in tests and "error" not in tests))
    return out


def _all_equal(text: str) -> bool:
    same, _, of = text.partition(" of ")
    return same == of
