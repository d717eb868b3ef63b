"""Issue 44's table, computed from one run of bench/mem_gpu.py: what was measured against each
goal. The run prints it last; bench/report.py puts it in the README from the committed JSON
(bench/results/mem_h100.json), so no figure there is typed by hand."""

from __future__ import annotations

from collections.abc import Callable

Row = tuple[str, str, bool | None]


def _part(result: dict, name: str) -> dict | None:
    part = result.get(name)
    return part if isinstance(part, dict) and "error" not in part and "skipped" not in part else None


def _missing(result: dict, name: str) -> str:
    part = result.get(name) or {}
    return f"not measured ({part.get('error') or part.get('skipped') or 'not run'})"[:140]


def _spec_rows(s: dict) -> list[Row]:
    rows = {r["batch"]: r for r in s["rows"]}
    ratios = " / ".join(f"{rows[b]['drafts_over_none']:.2f}x" for b in sorted(rows))
    one = rows[min(rows)]
    hf = s.get("hf_prompt_lookup", {}).get("tokens_per_pass")
    same = all(r["same_tokens"] for r in rows.values())
    return [(f"drafts k = 4 / none, repetitive prompts, batch {' / '.join(map(str, sorted(rows)))} "
             "(SmolLM2 shapes; kept from issue 31)",
             f"{ratios}; {one['k4']['tokens_per_pass']:.2f} tokens a pass (HF prompt lookup: "
             f"{hf if hf is not None else '?'}); same tokens: {'yes' if same else 'no'}",
             same and all(r["drafts_over_none"] >= g for r, g in zip(
                 (rows[b] for b in sorted(rows)), (2.0, 1.5, 1.0), strict=False)))]


def _rejects_rows(r: dict) -> list[Row]:
    def one(name: str, label: str) -> str:
        x = r[name]
        d = x["drafting_steps"]
        landed = d.get("steps_landed_for_a_lookup")
        landed = "" if landed is None else f", {landed} landed at once for a lookup"
        return (f"{x['drafts_over_none']:.3f}x ({label}{_turns(x)}; {d['steps_that_drafted']} of "
                f"{d['steps']} steps drafted{landed}, {x['k4']['kept']} of {x['k4']['drafted']} "
                "draft tokens kept)")

    worst = min(r["smollm2"]["drafts_over_none"], r["llama1b"]["drafts_over_none"])
    return [(f"drafts on at batch {r['smollm2'].get('batch', 64)}, temperature 1: the lookup finds "
             "drafts and sampling rejects them (≥ 0.97)",
             f"{one('smollm2', 'SmolLM2 shapes')}, {one('llama1b', '1B shape')}", worst >= 0.97)]


def _turns(x: dict) -> str:
    """A row read by turns (runs since 29): the median of its rounds' ratios, which it names."""
    per = x.get("per_round")
    if not per:
        return ""
    return (f"; median of {len(per)} rounds by turns, {min(per):.2f}-{max(per):.2f} "
            f"(ratio of medians {x['ratio_of_medians']:.3f})")


def _hybrid_rows(h: dict) -> list[Row]:
    out: list[Row] = []
    for plen, x in sorted(h.items(), key=lambda kv: int(kv[0])):
        goal = 1.4 if int(plen) >= 4096 else 1.0
        hy, fu = x["hybrid"], x["full"]
        gpu = (f", graph {hy['graph_gpu_ms']:.2f} vs {fu['graph_gpu_ms']:.2f} ms"
               if hy.get("graph_gpu_ms") and fu.get("graph_gpu_ms") else "")
        out.append((f"hybrid (half the layers a 128-token window) / all full, "
                    f"{x.get('requests', '?')} × {int(plen):,}-token "
                    f"prompts (≥ {goal})",
                    f"{x['hybrid_over_full']:.3f}x ({hy['tokens_per_s']:,.0f} vs {fu['tokens_per_s']:,.0f} "
                    f"tokens/s{_turns(x)}; prefill steps {hy['prefill_steps_s']:.2f} vs "
                    f"{fu['prefill_steps_s']:.2f} s, "
                    f"decode steps {hy['decode_steps_s']:.2f} vs {fu['decode_steps_s']:.2f} s; steady "
                    f"step {hy['step_ms']} vs {fu['step_ms']} ms{gpu})", x["hybrid_over_full"] >= goal))
    return out


def _tier_rows(t: dict) -> list[Row]:
    d, o, b = t["repeat_document"], t["overlap"], t["bandwidth"]
    bus = d["tier"].get("bus_copies", {}).get("in", {})
    link = b.get("link", {})
    return [
        (f"an evicted {d.get('tokens', 4096):,}-token document asked again, tier / recompute "
         "(1B shape) (≥ 4)",
         f"{d['recompute_over_tier']:.2f}x ({d['tier']['median_ms']:.1f} vs "
         f"{d['recompute']['median_ms']:.1f} ms; loads {bus.get('mb_per_copy', '?')} MB a copy"
         f"{_store_note(d)})",
         d["recompute_over_tier"] >= 4.0),
        ("other requests' tokens/s in the steps a load is issued (≥ 0.9)",
         f"{o['tokens_per_s_with_load_over_without']}x (step {o['load_step_ms']} vs "
         f"{o['quiet_step_ms']} ms, {o['steps_with_a_load']} steps with a load)",
         (o["tokens_per_s_with_load_over_without"] or 0) >= 0.9),
        ("tier copies each way, 1B shape (≥ 35 GB/s)",
         f"{b['gpu_to_cpu_gb_s']} / {b['cpu_to_gpu_gb_s']} GB/s GPU → CPU / CPU → GPU"
         f"{_timed_on(b)} (the bus: "
         f"{link.get('gpu_to_cpu_gb_s', '?')} / {link.get('cpu_to_gpu_gb_s', '?')}); bytes back "
         f"equal: {'yes' if b['same_bytes_back'] else 'no'}",
         min(b["gpu_to_cpu_gb_s"], b["cpu_to_gpu_gb_s"]) >= 35 and b["same_bytes_back"])]


def _timed_on(b: dict) -> str:
    """Where the copies were timed: on the device (runs after 57), with the host's own reading
    of the same copies beside it; runs before read the host's wall time alone."""
    if b.get("timed_on") != "device":
        return ""
    host = b["host_gb_s"]
    return f" on the device (the host saw the last byte at {host['out']} / {host['in']})"


def _store_note(d: dict) -> str:
    """When the tier stores blocks (`tier_store`), and what the request that evicts the document
    took on each side: a tier storing computed blocks pays there (runs before it lack both)."""
    t, r = d["tier"], d["recompute"]
    if "tier_store" not in t:
        return ""
    return (f"; tier_store {t['tier_store']}, the evicting request {t['evictor_median_ms']:.1f} vs "
            f"{r['evictor_median_ms']:.1f} ms")


def _roof_rows(r: dict) -> list[Row]:
    out: list[Row] = []
    for n, x in sorted(((k, v) for k, v in r.items() if k.isdigit()), key=lambda kv: int(kv[0])):
        graph = f", its graph {x['graph_over_roofline']:.2f}x" if x.get("graph_over_roofline") else ""
        out.append((f"1.2B decode step / HBM roofline, {n} sequences, context 512 (≤ 1.3)",
                    f"{x['async_over_roofline']:.2f}x (step {x['async_step_ms']} ms, roofline "
                    f"{x['roofline_ms']:.2f} ms{graph}; synchronous step {x.get('sync_step_ms')} ms)",
                    x["async_over_roofline"] <= 1.3))
    return out


PARTS: list[tuple[str, str, Callable[[dict], list[Row]]]] = [
    ("spec", "drafts k = 4 / none, repetitive prompts (SmolLM2 shapes)", _spec_rows),
    ("rejects", "drafts on at batch 64, temperature-1 rejections", _rejects_rows),
    ("hybrid", "hybrid / all full", _hybrid_rows),
    ("tier", "the CPU tier", _tier_rows),
    ("roofline", "1.2B decode step / HBM roofline", _roof_rows)]


def rows(result: dict) -> list[Row]:
    """Every row of the issue's table from one run's JSON (a part that failed says so)."""
    out: list[Row] = []
    for name, label, make in PARTS:
        part = _part(result, name)
        if part is None:
            out.append((label, _missing(result, name), False))
            continue
        try:
            out += make(part)
        except (KeyError, TypeError, ValueError) as err:
            out.append((label, f"incomplete: {type(err).__name__} {err}"[:140], False))
    return out


def _met(ok: bool | None) -> str:
    return "—" if ok is None else "yes" if ok else "**no**"


def table(result: dict, also: tuple[str, dict] | None = None) -> str:
    """The rows as a Markdown table, with the tests' line under it. `also` (label, another
    run's JSON of the same code) adds its figures in a column of their own: a row whose
    steps are bound by the host moved by a third from one lease to the next, and one run
    would hide that."""
    if also is None:
        lines = ["| what | measured | met |", "| --- | --- | --- |"]
        lines += [f"| {w} | {m} | {_met(ok)} |" for w, m, ok in rows(result)]
    else:
        label, other = also
        theirs = {w: (m, ok) for w, m, ok in rows(other)}
        lines = [f"| what | measured | met | {label} | met |", "| --- | --- | --- | --- | --- |"]
        for w, m, ok in rows(result):
            m2, ok2 = theirs.get(w, ("not run", None))
            lines.append(f"| {w} | {m} | {_met(ok)} | {m2} | {_met(ok2)} |")
    tests = result.get("tests") or {}
    total = result.get("total_s")
    took = f"{total} s in all" if total is not None else \
        f"{sum(result.get('part_s', {}).values()):.0f} s in its parts, stopped before its end"
    lines.append(f"\nGPU tests: {tests.get('summary', 'not run')} "
                 f"({result.get('device', '?')}, {took})")
    return "\n".join(lines)
