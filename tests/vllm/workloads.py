"""The same requests through PagedLab and through the real vLLM server, one after another, and
what each engine did: outputs, cached tokens per request, every block hash stored, the hashes in
the cache at the end. vLLM's side is read from its HTTP answers and its KV events."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.vllm.server import VllmServer
from engine.vllm.watch import VllmWatch
from tests.vllm.conftest import BLOCK_SIZE, BUDGET, POOL_BLOCKS, settle


@dataclass(frozen=True)
class Req:
    prompt: list[int]
    max_tokens: int
    n: int = 1  # n > 1: temperature 1 with top_k 1 (vLLM refuses n > 1 when greedy), so argmax


@dataclass
class Run:
    outputs: list[list[tuple[int, ...]]] = field(default_factory=list)  # per request, per sample
    cached: list[int] = field(default_factory=list)  # num_cached_tokens per request
    stored: set[int] = field(default_factory=set)  # every hash stored during the run
    final: set[int] = field(default_factory=set)  # hashes in the cache at the end
    copies: int = 0  # physical blocks holding those hashes at the end

    @property
    def removed(self) -> set[int]:
        return self.stored - self.final


def pagedlab_engine(**overrides: Any) -> LLMEngine:
    """PagedLab set as the server is: block size, usable pool (vLLM's block 0 is its null
    block), step budget with chunked prefill, float32, vLLM's sha256 hash chain."""
    cfg = dict(model="default", device="cpu", dtype="float32", block_size=BLOCK_SIZE,
               num_gpu_blocks=POOL_BLOCKS - 1, max_num_batched_tokens=BUDGET,
               prefix_caching_hash_algo="sha256", track_kv_content=False)
    return LLMEngine(EngineConfig(**{**cfg, **overrides}))


def _params(r: Req) -> SamplingParams:
    if r.n > 1:
        return SamplingParams(max_tokens=r.max_tokens, n=r.n, temperature=1.0, top_k=1)
    return SamplingParams(max_tokens=r.max_tokens, temperature=0.0)


def run_pagedlab(eng: LLMEngine, reqs: list[Req]) -> Run:
    run = Run()
    for r in reqs:
        out = eng.generate([r.prompt], _params(r))[0]
        run.outputs.append([o.token_ids for o in sorted(out.outputs, key=lambda o: o.index)])
        run.cached.append(out.num_cached_tokens)
        run.stored |= _hashes(eng)
    run.final = _hashes(eng)
    run.copies = sum(b.block_hash is not None for b in eng.snapshot().blocks)
    eng.check_invariants()
    return run


def _hashes(eng: LLMEngine) -> set[int]:
    return {b.block_hash for b in eng.snapshot().blocks if b.block_hash is not None}


def run_vllm(server: VllmServer, watch: VllmWatch, reqs: list[Req]) -> Run:
    """The requests one after another on a server whose prefix cache starts empty. vLLM
    publishes the reset's AllBlocksCleared with the next step's events: what the run stored is
    what came after it."""
    server.reset_prefix_cache()
    run, events = Run(), []
    for r in reqs:
        extra = {"n": r.n, "temperature": 1.0, "top_k": 1} if r.n > 1 else {}
        got = server.complete(r.prompt, r.max_tokens, **extra)
        run.outputs.append([tuple(ids) for ids in got["outputs"]])
        run.cached.append(got["cached_tokens"])
        events += settle(watch)
    run.stored = stored_since_reset(events)
    run.final = watch.mirror.hashes()
    run.copies = watch.counts().copies
    return run


def stored_since_reset(events: list) -> set[int]:
    """The hashes stored after the last AllBlocksCleared of `events`."""
    cleared = [i for i, e in enumerate(events) if e.kind == "cleared"]
    assert cleared, "vLLM published no AllBlocksCleared after its prefix cache was reset"
    return {h for e in events[cleared[-1] + 1:] if e.kind == "stored" for h in e.block_hashes}


def chat(eng: LLMEngine, question: str, system: str = "") -> list[int]:
    """SmolLM2 answers a raw prompt with end-of-text at once: go through its chat template."""
    return list(eng.tokenizer.apply_chat_template(question, system))


def record(workload: str, ours: Run, theirs: Run) -> None:
    """What both engines did, appended as a JSON line to $PAGEDLAB_VLLM_RECORD when it is set
    (bench/vllm_conformance_time.py commits it beside the time the tests took)."""
    path = os.environ.get("PAGEDLAB_VLLM_RECORD")
    if not path:
        return
    row = {"workload": workload}
    for name, run in (("pagedlab", ours), ("vllm", theirs)):
        row[name] = {"cached_tokens": run.cached, "output_tokens": [len(o[0]) for o in run.outputs],
                     "samples": [len(o) for o in run.outputs], "hashes_stored": len(run.stored),
                     "hashes_removed": len(run.removed), "hashes_at_end": len(run.final),
                     "blocks_holding_them": run.copies}
    row["equal"] = {k: getattr(ours, k) == getattr(theirs, k)
                    for k in ("outputs", "cached", "stored", "final")}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
