"""What speculative decoding costs the host per step when sampling rejects what it would draft:
issue 44's "rejected drafts" row (bench/mem_parts.py `spec_rejects`) with the GPU taken away.

    python bench/spec_host.py --out /tmp/spec_host.json            # a CPU, about a minute
    python bench/spec_host.py --smoke --out /tmp/spec_host.json

On an H100 that row's SmolLM2-shaped steps are bound by the host (a 1.2B model's are not, and
there drafts on cost nothing: bench/results/mem_h100.json), so every microsecond the engine
spends per step on drafts it does not take shows in tokens/s. This measures those microseconds
on any machine, with drafts off and k = 4, in the same workload (64 requests of
bench/mem_parts.py's REJECT prompts, sampled at temperature 1, seed 1, 128 new tokens, async
scheduling), twice: in the dry mode (the engine's host work alone: no model, random picks of
its 256 tokens) and on a random Llama of the REJECT vocabulary, one layer of width 64 (its
forward pass a share of the step; noisier). The drafts' cost function is fixed at `--cost`
decode steps (default 2.5: about what a GPU's runtime says at batch 64 before it has measured
a verification, its graphs' ratio plus a step of lost overlap), since a CPU runtime's own (a
share per draft token) and the dry mode's (1) verify drafts that a GPU would not.

Per engine: host ms per step (each run's wall time over its steps, median and best of the
runs, the two engines' runs interleaved), how many steps verified drafts or landed at once
(lost their async overlap), and per run the lookups made (`NgramIndex.propose`), the positions
indexed and the sequences the drafting policy looked at. Whether the tokens are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench import device_step  # noqa: E402
from bench.mem_models import REJECT_VOCAB, stand_in_tokenizer  # noqa: E402
from bench.mem_parts import repetitive  # noqa: E402
from engine import LLMEngine, SamplingParams, step_run  # noqa: E402
from engine.core.draft_policy import DraftPolicy  # noqa: E402
from engine.core.ngram_index import NgramIndex  # noqa: E402

FULL = dict(seqs=64, new=128, repeats=7)
SMOKE = dict(seqs=8, new=16, repeats=2)


def tiny_model(folder: Path) -> str:
    """A seeded random Llama of the REJECT vocabulary, one layer of width 64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=REJECT_VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, tie_word_embeddings=True, initializer_range=0.02,
                         max_position_embeddings=8192, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    stand_in_tokenizer(REJECT_VOCAB).save_pretrained(folder)
    return str(folder)


@contextlib.contextmanager
def counting() -> Iterator[dict[str, int]]:
    """Count, while inside, the lookups, the positions indexed, the sequences the drafting
    policy looked at (its `state`) and the steps that landed at once (the class attributes are
    wrapped, then put back)."""
    counts = {"lookups": 0, "positions_indexed": 0, "policy_visits": 0, "landed_at_once": 0}
    propose, catch_up, state, pick = (NgramIndex.propose, NgramIndex.catch_up, DraftPolicy.state,
                                      step_run.pick)

    def counted_propose(self, *a, **kw):
        counts["lookups"] += 1
        return propose(self, *a, **kw)

    def counted_catch_up(self, *a, **kw):
        before = self.indexed
        catch_up(self, *a, **kw)
        counts["positions_indexed"] += max(0, self.indexed - before)

    def counted_state(self, *a, **kw):
        counts["policy_visits"] += 1
        return state(self, *a, **kw)

    def counted_pick(sched, *a, **kw):
        launched = pick(sched, *a, **kw)
        counts["landed_at_once"] += launched is not None and not launched.overlap
        return launched

    NgramIndex.propose, NgramIndex.catch_up, DraftPolicy.state = (
        counted_propose, counted_catch_up, counted_state)
    step_run.pick = counted_pick
    try:
        yield counts
    finally:
        NgramIndex.propose, NgramIndex.catch_up, DraftPolicy.state = propose, catch_up, state
        step_run.pick = pick


def one_run(eng: LLMEngine, prompts: list, params: SamplingParams) -> dict:
    """Every request through the engine: seconds, steps, steps that drafted, the tokens."""
    for p in prompts:
        eng.add_request(p, params)
    steps = drafted = 0
    ids: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    while eng.has_pending_work():
        result = eng.step()
        steps += 1
        drafted += any(e.kind == "draft" for e in result.events)
        for out in result.finished:
            ids[out.request_id] = list(out.outputs[0].token_ids)
    return {"seconds": time.perf_counter() - t0, "steps": steps, "drafting_steps": drafted,
            "ids": [ids[r] for r in sorted(ids)]}


def measure(path: str | None, sizes: dict, cost: float) -> dict:
    """Drafts off and k = 4 on the model at `path` (None: the dry mode, the engine's host work
    alone), their runs interleaved."""
    n = sizes["seqs"]
    params = SamplingParams(max_tokens=sizes["new"], temperature=1.0, seed=1, ignore_eos=True)
    prompts = repetitive(n, REJECT_VOCAB)
    engines = {k: device_step.engine(path, "cpu", k, n, n * 40 + 64) for k in (0, 4)}
    engines[4].scheduler.drafting.cost = lambda num_seqs, q: cost
    for eng in engines.values():
        one_run(eng, prompts, params)  # warm
    runs: dict[int, list[dict]] = {0: [], 4: []}
    for _ in range(sizes["repeats"]):
        for k, eng in engines.items():
            runs[k].append(one_run(eng, prompts, params))
    got: dict = {}
    for k, eng in engines.items():
        with counting() as counts:  # one more run, counted (counting costs time)
            last = one_run(eng, prompts, params)
        per_step = [1e3 * r["seconds"] / r["steps"] for r in runs[k]]
        got[f"k{k}"] = {"host_ms_per_step": round(statistics.median(per_step), 3),
                        "best_ms_per_step": round(min(per_step), 3), "steps": last["steps"],
                        "drafting_steps": last["drafting_steps"], **counts}
    got["same_tokens"] = runs[0][-1]["ids"] == runs[4][-1]["ids"]
    got["k4_over_k0_host"] = round(got["k4"]["host_ms_per_step"] / got["k0"]["host_ms_per_step"], 3)
    for eng in engines.values():
        eng.close()
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--cost", type=float, default=2.5, help="a verification's cost in decode steps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the host's own work, not a forward pass spread over cores
    with tempfile.TemporaryDirectory(prefix="spec-host-") as tmp:
        sizes = SMOKE if args.smoke else FULL
        got = {"tiny_model": measure(tiny_model(Path(tmp)), sizes, args.cost),
               "dry": measure(None, sizes, args.cost)}
    got.update(cost=args.cost, threads=torch.get_num_threads(), cpus=os.cpu_count(),
               load_average=os.getloadavg()[0])
    text = json.dumps(got, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
