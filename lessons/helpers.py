"""Helper functions lesson expressions may call, and the measurements lessons need that the engine's
public API does not offer directly. Each is deterministic and leaves the lesson's engine alone.

- Formatting: `kib`, `mib`, `gib`, `pct`, `fmt`, `md_table`.
- Architecture arithmetic (`ARCHITECTURES`, `kv_bytes_per_token`): published model shapes, so
  a learner can see what a 7B/13B model's KV cache costs. Labelled as arithmetic, not measured.
- Lesson 7 (`workload`, `reservation_fit`): a seeded workload and what contiguous reservations
  of it fit in a pool (the naive allocators); the paged side is measured by the `admit` op.
- Lesson 8 (`block_size_sweep`): runs one workload on dry engines of every block size and reads
  waste, table entries, blocks read per token and prefix hits from their snapshots.
- Lesson 9 (`AttentionProbe`): the real query of one token in one layer, caught with forward
  hooks on the shared model during one engine decode, and its attention weight per block.
- `measured`: a figure of a committed benchmark result (lessons 12 and 14 cite what the H100
  measured), read from bench/results, never typed.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import EngineConfig, LLMEngine, OutOfBlocks, ops
from engine.describe.baselines import reservation_fit, workload  # noqa: F401  (lessons call them by name)
from engine.describe.narration import plural  # the narration's own: "1 block", "2 blocks"
from engine.describe.units import gib, kib, mib  # noqa: F401  (lessons call them by name)

#: Published architecture constants (LLaMA paper, Table 2; fp16 weights and cache). Used only for
#: arithmetic ("what would the KV cache of this model cost"), never presented as a measurement.
ARCHITECTURES: dict[str, dict[str, int]] = {
    "LLaMA-7B": {"layers": 32, "kv_heads": 32, "head_dim": 128, "dtype_bytes": 2, "max_len": 2048},
    "LLaMA-13B": {"layers": 40, "kv_heads": 40, "head_dim": 128, "dtype_bytes": 2, "max_len": 2048},
}


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V (2) of one token in every layer: 2 x layers x kv_heads x head_dim x bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def fmt(x: Any, spec: str = "") -> str:
    """Python format spec on a number, e.g. fmt(x, ',') or fmt(x, '.2f')."""
    if not isinstance(spec, str) or len(spec) > 12:
        raise ValueError("a format spec is a short text like ',' or '.2f'")
    return format(x, spec)


def quote(text: str) -> str:
    """Model text for narration, on one line, in quotes: newlines shown as a return sign."""
    return "“" + str(text).replace("\n", "⏎").replace("`", "'").strip() + "”"


def md_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of dict rows (the columns in order; default: the first row's keys)."""
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns is not None else list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# ---- lesson 7: a workload and contiguous reservations ----------------------------------------------


def admit(act: Callable[[ops.Op], Any], requests: Sequence[dict[str, Any]]) -> int:
    """Add requests in order (prompt, then their output tokens) until the pool refuses one, each
    operation run by `act` (a lesson's run: its history records them). The refused operation
    leaves the engine as it was (all or nothing), so only whole requests stay."""
    admitted = 0
    for r in requests:
        try:
            seq = act(ops.AddSequence(list(r["prompt"])))
        except OutOfBlocks:
            break
        if r["output"]:
            try:
                act(ops.Append(seq, n=r["output"]))
            except OutOfBlocks:
                act(ops.Free(seq))
                break
        admitted += 1
    return admitted


# ---- lesson 8: one workload at every block size -----------------------------------------------------


def block_size_sweep(sizes: Sequence[int], shared_prefix: int, suffixes: Sequence[int], decode: int,
                     seed: int = 0) -> list[dict[str, Any]]:
    """Run the same workload on a dry engine at each block size and read the snapshot. Workload:
    len(suffixes) requests whose prompts start with the same `shared_prefix` tokens (a system
    prompt), then their own suffix, then `decode` generated tokens each. Per block size: empty
    reserved slots (internal waste), block-table entries, blocks read per query token by the
    kernel (one per block of the context, averaged over every decoded token), prefix-hit tokens."""
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(shared_prefix)]
    prompts = [prefix + [rng.randrange(256) for _ in range(s)] for s in suffixes]
    need = sum(len(p) + decode for p in prompts)
    rows = []
    for bs in sizes:
        cfg = EngineConfig(model=None, block_size=bs, num_gpu_blocks=need + len(prompts), seed=seed)
        eng = LLMEngine(cfg)
        seqs = [eng.add_sequence(p) for p in prompts]
        reads = 0
        for s in seqs:
            for _ in range(decode):  # the kernel reads every block of the context for the new token
                eng.append(s, n=1)
                reads += len(eng.snapshot().sequences[s].block_table)
        snap = eng.snapshot()
        views = [snap.sequences[s] for s in seqs]
        rows.append({
            "block size": bs,
            "waste slots": sum(len(v.block_table) * bs - v.num_tokens for v in views),
            "table entries": snap.metrics.logical_blocks,
            "blocks read per token": reads / (decode * len(seqs)) if decode else 0.0,
            "prefix-hit tokens": sum(v.num_cached_tokens for v in views),
            "used blocks": snap.metrics.used_blocks,
            "used slots": snap.metrics.used_blocks * bs,
        })
    return rows


# ---- lesson 13: a long request in a hybrid model ---------------------------------------------------


def hybrid_request(num_tokens: int, window: int, block_size: int) -> dict[str, int]:
    """One prompt of `num_tokens` tokens on a dry engine with a hybrid's two KV cache groups
    (full, and sliding with `window`): the blocks each of its tables holds after the prefill."""
    if not 1 <= num_tokens <= 1 << 16:
        raise ValueError(f"num_tokens must be between 1 and {1 << 16}, got {num_tokens}")
    blocks = 2 * -(-num_tokens // block_size)  # room for both tables before the window drops
    eng = LLMEngine(EngineConfig(model=None, block_size=block_size, num_gpu_blocks=blocks,
                                 sliding_window=window))
    seq = eng.add_sequence([7] * num_tokens)
    view = eng.snapshot().sequences[seq]
    return {name: sum(b is not None for b in table) for name, table in view.block_tables.items()}


# ---- lesson 9: the attention of one query token, block by block ------------------------------------


@dataclass(frozen=True)
class ProbeResult:
    """What one decode step's query token read, in the order the kernel reads it."""

    seq_id: int
    layer: int
    position: int  # the query token's position (its K/V is the last slot of the context)
    block_table: tuple[int, ...]  # physical blocks, in logical order: the kernel's read order
    tokens_per_block: tuple[int, ...]
    weights: tuple[float, ...]  # attention weight per block (softmax over the context, mean over heads)
    head_weights: tuple[tuple[float, ...], ...]  # [query head][block]
    max_error: float  # |our recombined output - the model's attention output|, max over elements
    top_block: int  # logical index of the block with the largest weight

    @property
    def num_blocks(self) -> int:
        return len(self.block_table)


class AttentionProbe:
    """Catches layer `layer`'s input and output of attention during one engine call.

    The engine does not expose queries, so we hook the shared HF model for the length of one
    decode: a forward pre-hook on the layer's attention module records its input hidden states
    and rotary embedding, a pre-hook on `o_proj` records the attention output the paged kernel
    produced. The query is then recomputed exactly as the model computes it (q_proj + RoPE), the
    keys are read from the real blocks (`inspect_block`), and softmax(q.K / sqrt(d)) is summed per
    block. Recombining the weights with the blocks' V must give back the kernel's output: the
    lesson checks `max_error`. (Hooks are global to the shared model: use it in one session.)"""

    def __init__(self, engine: LLMEngine, layer: int) -> None:
        if engine.config.dry:
            raise ValueError("probe needs a real model (the dry mode has no attention)")
        self.engine = engine
        self.loaded = engine.loaded_model()
        self.model = self.loaded.model
        self.layer = layer
        self.captured: dict[str, Any] = {}

    @contextmanager
    def hooks(self) -> Iterator[None]:
        attn = self.model.model.layers[self.layer].self_attn

        def on_attention(module: Any, args: tuple, kwargs: dict) -> None:
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            self.captured["hidden"] = hidden.detach()
            self.captured["rope"] = tuple(t.detach() for t in kwargs["position_embeddings"])

        def on_output(module: Any, args: tuple) -> None:
            self.captured["out"] = args[0].detach()

        handles = [attn.register_forward_pre_hook(on_attention, with_kwargs=True),
                   attn.o_proj.register_forward_pre_hook(on_output)]
        try:
            with self.engine.module_path():  # hooks fire only in the modules
                yield
        finally:
            for h in handles:
                h.remove()

    def result(self, seq_id: int) -> ProbeResult:
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        attn = self.model.model.layers[self.layer].self_attn
        hidden, (cos, sin), out = self.captured["hidden"], self.captured["rope"], self.captured["out"]
        loaded = self.loaded
        qh, kvh, d = loaded.num_q_heads, loaded.num_kv_heads, loaded.head_dim
        with torch.no_grad():
            q = attn.q_proj(hidden).view(*hidden.shape[:-1], qh, d).transpose(1, 2)  # [1, qh, T, d]
            q, _ = apply_rotary_pos_emb(q, q, cos, sin)
            q = q[0, :, -1].float().cpu()  # the last (newest) token's query, [qh, d]
        view = self.engine.snapshot().sequences[seq_id]
        bs = self.engine.config.block_size
        ks, vs, per_block = [], [], []
        for i, b in enumerate(view.block_table):
            k, v = self.engine.inspect_block(b, self.layer)
            n = min(bs, view.num_tokens - i * bs)
            ks.append(k[:n])
            vs.append(v[:n])
            per_block.append(n)
        K, V = torch.cat(ks), torch.cat(vs)  # [ctx, kvh, d]
        group = qh // kvh  # grouped-query attention: query head h reads KV head h // group
        K, V = K.repeat_interleave(group, dim=1), V.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q, K) * float(attn.scaling)
        probs = scores.softmax(dim=-1)  # [qh, ctx]
        mine = torch.einsum("ht,thd->hd", probs, V).reshape(-1)
        theirs = out[0, -1].float().cpu()
        bounds = [0]
        for n in per_block:
            bounds.append(bounds[-1] + n)
        head_w = [[float(probs[h, bounds[i]:bounds[i + 1]].sum()) for i in range(len(per_block))]
                  for h in range(qh)]
        mean_w = [sum(col) / qh for col in zip(*head_w, strict=True)]
        return ProbeResult(seq_id, self.layer, view.num_tokens - 1, view.block_table, tuple(per_block),
                           tuple(mean_w), tuple(tuple(r) for r in head_w),
                           float((mine - theirs).abs().max()),
                           max(range(len(mean_w)), key=mean_w.__getitem__))


RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def measured(name: str, *path: str | int) -> Any:
    """A figure from a committed benchmark result (bench/results/<name>), e.g. what drafts gained
    on an H100: measured by bench/, read here, never typed into a lesson. `path` walks the JSON:
    keys of objects, indexes of lists."""
    if "/" in name or "\\" in name or not name.endswith(".json"):
        raise ValueError(f"measured() reads a results file by name (bench/results/*.json), got {name!r}")
    value: Any = json.loads((RESULTS / name).read_text())
    for key in path:
        value = value[key]
    return value


def short_hash(h: int | None) -> str:
    """A block hash as the pictures print it: its low 32 bits in hex ("—": none)."""
    return "—" if h is None else f"{int(h) & 0xFFFFFFFF:08x}"


PURE_HELPERS: dict[str, Any] = {
    "short_hash": short_hash,
    "kv_bytes_per_token": kv_bytes_per_token, "kib": kib, "mib": mib, "gib": gib, "pct": pct,
    "fmt": fmt, "plural": plural, "quote": quote, "md_table": md_table, "workload": workload,
    "reservation_fit": reservation_fit,
    "block_size_sweep": block_size_sweep, "hybrid_request": hybrid_request, "ceil": math.ceil,
    "floor": math.floor, "sqrt": math.sqrt, "log2": math.log2, "measured": measured,
}
