"""The measurements of issue 44's GPU run (bench/mem_gpu.py), one function a row of its table.

Each compares two engines built in this process on the same device, both warm, their runs
interleaved where it matters (bench/device_step.py's `timed_runs`); each returns plain data
for the run's JSON. The workloads and models are bench/mem_models.py's; prompts are token ids.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from bench import device_step, tier
from bench.device_step import sync, timed_runs
from bench.mem_models import REJECT_VOCAB
from engine import EngineConfig, LLMEngine, SamplingParams


def repetitive(batch: int, vocab: int) -> list[list[int]]:
    """`batch` prompts of an 8-token phrase said 8 times and a token of their own (the token-id
    form of bench/device_step.py's "one two ... eight" prompt)."""
    phrase = [vocab // 2 + j for j in range(8)] if vocab <= 1024 else [1000 + j for j in range(8)]
    return [phrase * 8 + [(vocab // 4 + i) % vocab] for i in range(batch)]


def _ratio(got: dict[int, dict]) -> float:
    return round(got[4]["tokens_per_s"] / got[0]["tokens_per_s"], 3)


def _paired(row: dict, got: dict[int, dict]) -> dict:
    """A rejects row's readings from timed_runs' turns: `drafts_over_none` the median of each
    round's ratio (the two runs side by side), `ratio_of_medians` the older reading."""
    row["drafts_over_none"], row["per_round"] = paired_ratio(got[0]["runs_s"], got[4]["runs_s"])
    row["ratio_of_medians"] = _ratio(got)
    return row


def spec_greedy(path: str, device: str, sizes: dict) -> dict:
    """Drafts k = 4 against none, greedy, repetitive prompts, at each batch: tokens/s, tokens a
    pass, the same tokens."""
    top = max(sizes["batches"])
    engines = {k: device_step.engine(path, device, k, top, top * 40 + 64) for k in (0, 4)}
    rows = []
    for batch in sizes["batches"]:
        got = timed_runs(engines, repetitive(batch, 49152),
                         SamplingParams(max_tokens=sizes["new"], ignore_eos=True), device,
                         sizes["repeats"])
        rows.append({"batch": batch, "drafts_over_none": _ratio(got),
                     "same_tokens": got[4].pop("ids") == got[0].pop("ids"), "k0": got[0],
                     "k4": got[4]})
    costs = engines[4].runtime.step_costs()
    for eng in engines.values():
        eng.close()
    return {"rows": rows, "step_costs_ms": costs}


def spec_rejects(path: str, device: str, sizes: dict) -> dict:
    """Drafts k = 4 against none at the largest batch, sampled at temperature 1 on a model
    whose samples make the lookup find drafts that sampling rejects (bench/mem_models.py):
    tokens/s, how many drafts were made and kept, how many steps verified drafts."""
    top = max(sizes["batches"])
    engines = {k: device_step.engine(path, device, k, top, top * 40 + 64) for k in (0, 4)}
    params = SamplingParams(max_tokens=sizes["new"], temperature=1.0, seed=1, ignore_eos=True)
    prompts = repetitive(top, REJECT_VOCAB)
    got = timed_runs(engines, prompts, params, device, sizes.get("reject_repeats", sizes["repeats"]),
                     alternate=True)
    same = got[4].pop("ids") == got[0].pop("ids")  # seeded: rejection sampling keeps them
    drafting = _drafting_steps(engines[4], prompts, params)
    costs = engines[4].runtime.step_costs()
    host = host_difference(engines, prompts, params)
    for eng in engines.values():
        eng.close()
    return _paired({"batch": top, "same_tokens": same, "k0": got[0], "k4": got[4],
                    "drafting_steps": drafting, "step_costs_ms": costs,
                    "host_k4_minus_k0": host}, got)


def rejects_order(path: str, device: str, sizes: dict) -> dict:
    """Is the drafting engine's extra time (run 33: its `decode` and sampler too, functions that
    do the same work in both engines) its drafting, or something else about it? Four engines of
    the rejects row, built in this order: drafts k = 4, none, none again, and k = 4 with its
    schedule's drafting switched off (`_draft` does nothing: the step clock and its kind stay).
    Their runs by turns (the order reversed every other round), each one's ratio to the first
    engine without drafts round by round, and each one's GPU busy time in one run."""
    top = max(sizes["batches"])
    params = SamplingParams(max_tokens=sizes["new"], temperature=1.0, seed=1, ignore_eos=True)
    prompts = repetitive(top, REJECT_VOCAB)
    built = {"k4": 4, "k0": 0, "k0_again": 0, "k4_inert": 4}
    engines = {name: device_step.engine(path, device, k, top, top * 40 + 64)
               for name, k in built.items()}
    engines["k4_inert"].scheduler._draft = lambda out: None  # this engine's schedule only
    for eng in engines.values():
        eng.generate(prompts, params)  # warm
    times = _by_turns(engines, [prompts] * sizes.get("reject_repeats", sizes["repeats"]), params,
                      device)
    got: dict = {"built_in_order": list(built), "runs_s": {n: [round(t, 4) for t in ts]
                                                          for n, ts in times.items()}}
    for name in engines:
        if name != "k0":
            got[f"{name}_over_k0"], got[f"{name}_per_round"] = paired_ratio(times["k0"], times[name])
    got["gpu_busy_ms"] = {name: _gpu_busy_ms(eng, prompts, params, device)
                          for name, eng in engines.items()}
    for eng in engines.values():
        eng.close()
    return got


def _gpu_busy_ms(eng: LLMEngine, prompts: list, params: SamplingParams, device: str) -> float | None:
    """The device's kernels and copies in one run, summed (ms): the same work gives the same."""
    if device != "cuda":
        return None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        eng.generate(prompts, params)
        sync(device)
    total = sum(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
                for e in prof.key_averages())
    return round(total / 1e3, 3)


def host_difference(engines: dict[int, LLMEngine], prompts: list, params: SamplingParams,
                    top: int = 12, rounds: int = 3) -> list[dict]:
    """Where the drafting engine's host time goes that the other's does not: `rounds` more runs
    of each under cProfile, by turns (the order swapped each round, as the timed runs are: run 32
    read one profiled run of each, one after the other, and its `decode` difference swung from
    14 to 33 ms), the engine's functions by how much longer they ran in the drafting one
    (cumulative ms a run, the largest differences)."""
    import cProfile
    import pstats

    cum: dict[int, dict[str, float]] = {k: {} for k in engines}
    for r in range(rounds):
        for k in (sorted(engines) if r % 2 == 0 else sorted(engines, reverse=True)):
            prof = cProfile.Profile()
            prof.enable()
            engines[k].generate(prompts, params)
            prof.disable()
            for (path, _, func), row in pstats.Stats(prof).stats.items():
                if "/engine/" in path:
                    name = f"{path[path.index('/engine/') + 1:]}:{func}"
                    cum[k][name] = cum[k].get(name, 0.0) + row[3] / rounds
    a, b = cum[min(cum)], cum[max(cum)]
    rows = sorted(((b.get(n, 0.0) - a.get(n, 0.0), n) for n in set(a) | set(b)), reverse=True)
    return [{"function": n, "more_ms": round(1e3 * d, 2), "k0_ms": round(1e3 * a.get(n, 0.0), 2)}
            for d, n in rows[:top]]


def _drafting_steps(eng: LLMEngine, prompts: list, params: SamplingParams) -> dict:
    """One more run: its steps, those that verified drafts, and those that landed at once for
    a lookup (async scheduling gave up its overlap so that the next step could draft: counted
    at the policy, which the engine does not report)."""
    policy = eng.scheduler.drafting
    landed = [0]

    def counted(*args: Any, **kw: Any) -> bool:
        wants = policy.__class__.wants_lookup(policy, *args, **kw)
        landed[0] += wants
        return wants

    policy.wants_lookup = counted  # this engine's policy only, for this run
    for p in prompts:
        eng.add_request(p, params)
    steps = drafting = 0
    try:
        while eng.has_pending_work():
            result = eng.step()
            steps += 1
            drafting += any(e.kind == "draft" for e in result.events)
    finally:
        del policy.wants_lookup
    return {"steps": steps, "steps_that_drafted": drafting, "steps_landed_for_a_lookup": landed[0]}


def hf_lookup(path: str, device: str, sizes: dict) -> dict:
    """Hugging Face's prompt lookup (k = 4) on the same model and prompt, batch 1: tokens per
    forward pass (calls of the model counted by a hook; the prefill's aside)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, device_step.dtype(
        device))).to(device)
    calls = [0]
    model.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    ids = torch.tensor(repetitive(1, 49152), device=device)
    with torch.inference_mode():
        gen = model.generate(ids, do_sample=False, max_new_tokens=sizes["new"], pad_token_id=0,
                             min_new_tokens=sizes["new"], prompt_lookup_num_tokens=4)
    new = gen.shape[1] - ids.shape[1]
    del model
    return {"new_tokens": new, "forward_passes": calls[0],
            "tokens_per_pass": round(new / max(1, calls[0] - 1), 3)}


def hybrid(paths: dict[str, str], device: str, sizes: dict) -> dict:
    """Hybrid (half the layers a 128-token window) against all full, n requests of each prompt
    length. Both engines are built first and their runs taken by turns (new prompts each round,
    the two sides' order swapped every round), because the host's speed switches within a part
    (runs 18-28): `hybrid_over_full` is the median of each round's ratio, two runs side by side;
    `ratio_of_medians` is the older reading. Then, for each engine, the time of the prefill steps
    and of the decode steps of one more run, and the steady decode step with its graph's GPU
    time."""
    from bench import hybrid as prompts_of

    out: dict[str, Any] = {}
    n, new = sizes["hybrid_requests"], sizes["hybrid_new"]
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    for plen in sizes["hybrid_prompts"]:
        engines = {name: _hybrid_engine(path, name == "hybrid", n, plen + new, device)
                   for name, path in paths.items()}
        for eng in engines.values():
            eng.generate(prompts_of._prompts(2, plen, plen, 2), SamplingParams(max_tokens=8,
                                                                                ignore_eos=True))
        rounds = [prompts_of._prompts(n, plen, plen, 10 + r)
                  for r in range(sizes.get("hybrid_rounds", 3))]
        times = _by_turns(engines, rounds, params, device)
        row: dict[str, Any] = {}
        for name, eng in engines.items():
            phases = _phases(eng, prompts_of._prompts(n, plen, plen, 30), params, device)
            phases["prefill_profile"] = _prefill_profile(eng, prompts_of._prompts(
                n, plen, plen, 40), params, device)
            steady = device_step.mid_run(eng, prompts_of._prompts(n, plen, plen, 20), params)
            row[name] = {"tokens_per_s": round(n * new / statistics.median(times[name]), 1),
                         "runs_s": [round(t, 3) for t in times[name]], **phases, **steady}
        for eng in engines.values():
            eng.close()
        row["hybrid_over_full"], row["per_round"] = paired_ratio(times["full"], times["hybrid"])
        row["ratio_of_medians"] = round(row["hybrid"]["tokens_per_s"] / row["full"]["tokens_per_s"], 3)
        row["requests"] = n
        out[str(plen)] = row
    return out


def _hybrid_engine(path: str, hybrid: bool, n: int, seq_len: int, device: str) -> LLMEngine:
    # the same bytes for both: the hybrid's pages hold half the layers, twice the blocks
    blocks = (n * -(-seq_len // 16) + 256) * (2 if hybrid else 1)
    return LLMEngine(EngineConfig(model=path, device=device, dtype=device_step.dtype(device),
                                  block_size=16, num_gpu_blocks=blocks, max_num_seqs=n,
                                  max_num_batched_tokens=8192, async_scheduling=True))


def _by_turns(engines: dict[str, LLMEngine], rounds: list[list], params: SamplingParams,
              device: str) -> dict[str, list[float]]:
    """Each engine's wall time for `generate` of each round's prompts, the engines by turns and
    in reversed order every other round (so neither always goes first)."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for r, prompts in enumerate(rounds):
        for name in (list(engines) if r % 2 == 0 else list(reversed(engines))):
            sync(device)
            t0 = time.perf_counter()
            engines[name].generate(prompts, params)
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def paired_ratio(base_s: list[float], other_s: list[float]) -> tuple[float, list[float]]:
    """How many times faster `other` ran than `base`, from runs taken by turns: the median of
    each round's own ratio (two runs side by side share the host's speed of the moment), and
    those ratios."""
    per_round = [round(b / o, 3) for b, o in zip(base_s, other_s, strict=True)]
    return round(statistics.median(per_round), 3), per_round


def _phases(eng: LLMEngine, prompts: list, params: SamplingParams, device: str) -> dict:
    """One run, its steps' wall times summed by kind: steps that prefill, steps that only decode."""
    for p in prompts:
        eng.add_request(p, params)
    prefill = decode = 0.0
    sync(device)
    while eng.has_pending_work():
        t0 = time.perf_counter()
        result = eng.step()
        wall = time.perf_counter() - t0
        if result.num_prefills:
            prefill += wall
        else:
            decode += wall
    sync(device)
    return {"prefill_steps_s": round(prefill, 4), "decode_steps_s": round(decode, 4)}


def _prefill_profile(eng: LLMEngine, prompts: list, params: SamplingParams, device: str,
                     steps: int = 3) -> dict:
    """The first `steps` steps of a run (prefills) under torch.profiler: their wall, and the GPU
    kernels that took most of it (why a hybrid model's prefill is no faster than a full one's)."""
    for p in prompts:
        eng.add_request(p, params)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sync(device)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            eng.step()
        sync(device)
    wall = time.perf_counter() - t0
    while eng.has_pending_work():
        eng.step()
    return {"steps": steps, "wall_ms": round(1e3 * wall, 2),
            "top": _top_ops(prof, "self_device_time_total" if device == "cuda"
                            else "self_cpu_time_total"),
            "host_top": _top_ops(prof, "self_cpu_time_total")}


def _top_ops(prof: Any, key: str, n: int = 8) -> list[dict]:
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)[:n]
    return [{"name": e.key[:60], "ms": round(getattr(e, key, 0) / 1e3, 3), "calls": e.count}
            for e in rows]


def link_bandwidth(device: str, nbytes: int = 64 << 20) -> dict:
    """The bus itself: one copy of `nbytes` between pinned host memory and the device, each way
    (median of 5 after a warm-up), what the tier's copies are set against."""
    if device != "cuda":
        return {}
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out: dict[str, float] = {}
    for way, (dst, src) in (("gpu_to_cpu", (host, dev)), ("cpu_to_gpu", (dev, host))):
        times = []
        for i in range(6):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            if i:
                times.append(start.elapsed_time(end) / 1e3)
        out[f"{way}_gb_s"] = round(nbytes / statistics.median(times) / 1e9, 1)
    return out


def tier_all(path: str, device: str, sizes: dict) -> dict:
    """The CPU tier, 1B shape: its copies' bandwidth each way against the bus's, a 4,096-token
    document evicted and asked again (tier against recompute), other requests' steps while a
    prompt's blocks come back, and where one repeat's time goes (profile)."""
    out: dict[str, Any] = {"bandwidth": {**tier.bandwidth(path, device, sizes),
                                         "link": link_bandwidth(device)}}
    doc = sizes["doc"]
    with_tier = tier.repeat_cycle(path, device, doc, sizes, tier.REPEAT_TIER)
    plain = tier.repeat_cycle(path, device, doc, sizes, 0)
    out["repeat_document"] = {"tokens": doc, "tier": with_tier, "recompute": plain,
                              "recompute_over_tier": round(plain["median_ms"] / with_tier["median_ms"], 3),
                              "same_first_tokens": with_tier["first_tokens"] == plain["first_tokens"]}
    out["overlap"] = tier.overlap(path, device, sizes)
    out["profile"] = tier.profile(path, device, {**sizes, "system": doc})
    return out


def roofline(path: str, device: str, sizes: dict) -> dict:
    """bench/device_step.py's roofline part (async and synchronous steady steps, the graph's GPU
    time and kernels, the host's profile) on the 1.2B model."""
    return device_step.roofline(path, device, sizes)
