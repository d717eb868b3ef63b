"""What a lesson's expressions may read: the context names (the engine's snapshot, the step's
events, the lesson's params and bound names) and the helper functions, built fresh from the live
engine for every evaluation. KNOWN_NAMES lists them all, so the loader checks names statically."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from engine import Event, LLMEngine
from engine.describe import narrate
from engine.describe.snapshot import Snapshot
from engine.requests import chat_prompt
from lessons import helpers
from lessons.safe_eval import Evaluator
from lessons.verbs import PlayState, seq_id


def evaluator(eng: LLMEngine, st: PlayState, params: Mapping[str, Any], step_number: int,
              total_steps: int) -> Evaluator:
    """An evaluator over the engine as it is now and what the lesson has bound so far."""
    snap = eng.snapshot()
    names: dict[str, Any] = {
        "snap": snap, "metrics": snap.metrics, "blocks": snap.blocks, "seqs": snap.sequences,
        "events": tuple(st.events), "block_size": snap.block_size, "num_blocks": snap.num_blocks,
        "info": MappingProxyType(eng.engine_info()), "dry": eng.config.dry,
        "config": MappingProxyType(eng.config.to_dict()), "model": _model_info(eng),
        "step_number": step_number, "total_steps": total_steps, "result": st.last_result,
        "outputs": MappingProxyType(dict(st.outputs)), "ARCHITECTURES": helpers.ARCHITECTURES,
        "params": MappingProxyType(dict(params)), "trace_len": len(eng.trace),
        "None": None, "True": True, "False": False,
    }
    names.update(params)
    names.update(st.names)
    return Evaluator(names, _helpers(eng, snap, st))


def _helpers(eng: LLMEngine, snap: Snapshot, st: PlayState) -> dict[str, Callable[..., Any]]:
    def seq(s: int) -> Any:
        sid = seq_id(s)
        if sid not in snap.sequences:
            raise ValueError(f"seq {sid} is not live (freed or finished)")
        return snap.sequences[sid]

    def count(kind: str) -> int:
        return sum(1 for e in st.events if e.kind == kind)

    def events_of(kind: str) -> list[Event]:
        return [e for e in st.events if e.kind == kind]

    def block(b: int) -> Any:
        return snap.blocks[b]

    def output(rid: int) -> Any:
        if rid not in st.outputs:
            raise ValueError(f"request {rid} has no output yet (step it first)")
        return st.outputs[rid]

    def same_kv(src: int, dst: int, layer: int = 0, slots: int | None = None) -> bool:
        """Whether two physical blocks hold the same K and V bytes in their first `slots` slots."""
        (k1, v1), (k2, v2) = eng.inspect_block(src, layer), eng.inspect_block(dst, layer)
        n = snap.block_size if slots is None else slots
        return bool((k1[:n] == k2[:n]).all() and (v1[:n] == v2[:n]).all())

    def request_seqs(rid: int) -> list[Any]:
        req = eng.request(rid)
        ids = () if req is None else req.seq_ids
        return [snap.sequences[s] for s in ids if s in snap.sequences]

    def decode(token_ids: Any) -> str:
        return eng.decode(list(token_ids))

    def shared_blocks() -> list[int]:
        return [b.block_id for b in snap.blocks if b.ref_count > 1]

    def waste(s: int) -> int:
        v = seq(s)
        return len(v.block_table) * snap.block_size - v.num_tokens

    def encode(text: str) -> list[int]:
        return eng.encode(text)

    def chat(text: str, system: str = "") -> list[int] | str:
        """An instruction as the chat model takes it (its template's token ids, after `system`
        if given): on the bare text SmolLM2 answers its end-of-turn token at once. The text
        itself in the dry mode."""
        ids = chat_prompt(eng.tokenizer, text, system)
        return text if ids is None else ids

    h: dict[str, Callable[..., Any]] = {
        "len": len, "sum": sum, "min": min, "max": max, "abs": abs, "round": round, "sorted": sorted,
        "range": _range, "list": list, "str": str, "int": int, "float": float, "any": any, "all": all,
        "set": lambda x: sorted(set(x)), "join": _join, "show": show,
        "seq": seq, "table": lambda s: list(seq(s).block_table), "tokens": lambda s: list(seq(s).token_ids),
        # a hybrid model's tables by KV cache group, and the blocks one of them holds now
        "tables": lambda s: {g: list(t) for g, t in seq(s).block_tables.items()},
        "held": lambda s, group: sum(b is not None for b in seq(s).block_tables[group]),
        "text": lambda s: seq(s).text, "block": block, "ref": lambda b: block(b).ref_count,
        "count": count, "events_of": events_of, "narrate": narrate, "output": output,
        "same_kv": same_kv,
        "request_seqs": request_seqs, "decode": decode, "shared_blocks": shared_blocks, "waste": waste,
        "encode": encode, "chat": chat, "live": lambda s: seq_id(s) in snap.sequences,
        "reservation_fit": helpers.reservation_fit,
    }
    h.update(helpers.PURE_HELPERS)
    return h


def _model_info(eng: LLMEngine) -> Any:
    lm = eng.loaded_model()
    if lm is None:
        return None
    element = {"float32": 4, "float16": 2, "bfloat16": 2}.get(str(lm.dtype).replace("torch.", ""), 0)
    return MappingProxyType({
        "name": lm.name, "layers": lm.num_layers, "q_heads": lm.num_q_heads, "kv_heads": lm.num_kv_heads,
        "head_dim": lm.head_dim, "dtype": str(lm.dtype).replace("torch.", ""), "dtype_bytes": element,
        "max_len": lm.max_position_embeddings, "hidden": int(lm.config.hidden_size),
    })


def _range(*args: int) -> range:
    r = range(*args)
    if len(r) > 1_000_000:
        raise ValueError("range too long")
    return r


def _join(items: Any, sep: str = ", ") -> str:
    return sep.join(show(x) for x in items)


def show(value: Any) -> str:
    """How a value appears in narration, written for people: yes / no, not True / False; a list
    as "1, 2 and 3", not "[1, 2, 3]"; floats briefly."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple | set | frozenset):
        items = [show(v) for v in value]
        if not items:
            return "none"
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    return str(value)


#: every name an expression may read: the context's names and the helpers (for load-time checks)
KNOWN_NAMES: set[str] = {
    "snap", "metrics", "blocks", "seqs", "events", "block_size", "num_blocks", "info", "dry", "config",
    "model", "step_number", "total_steps", "result", "outputs", "ARCHITECTURES", "params", "trace_len",
    "None", "True", "False",
} | {
    "len", "sum", "min", "max", "abs", "round", "sorted", "range", "list", "str", "int", "float", "any",
    "all",
    "set", "join", "show", "seq", "table", "tokens", "text", "block", "ref", "count", "events_of",
    "narrate", "output", "same_kv", "request_seqs", "decode", "shared_blocks", "waste", "encode",
    "chat", "live", "reservation_fit",
    "tables", "held",
} | set(helpers.PURE_HELPERS)
