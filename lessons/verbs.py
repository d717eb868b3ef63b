"""The verbs of a lesson's ```ops blocks, defined once: each verb's arguments (the loader checks
them when the lesson loads) and what it does (the runner calls it).

The verbs that are engine operations (add_sequence, append, fork, free, request, step) build the
operation of engine/ops.py and act it on the lesson's run (`Player.act`: its history records it),
so a lesson's op log is the same vocabulary as the playground's. let, run, probe, admit and
engine are lesson verbs: a value, steps until the requests finish, the attention probe, the
lesson-7 admission count, a fresh engine; vllm sends a prompt to the lab's vLLM (lesson 15).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine import Event, LLMEngine, SamplingParams, ops
from lessons import helpers
from lessons.lesson import ENGINE_KEYS

#: steps one `run` takes at most (a lesson that never finishes fails instead of hanging)
MAX_RUN_STEPS = 500


@dataclass
class PlayState:
    """What a lesson's ops have produced so far (a LessonRun's state between steps)."""

    names: dict[str, Any] = field(default_factory=dict)  # bound by ops: seq ids, request ids, values
    seq_names: dict[int, str] = field(default_factory=dict)  # seq id -> the name an op bound it to
    outputs: dict[int, Any] = field(default_factory=dict)  # request id -> its latest RequestOutput
    events: list[Event] = field(default_factory=list)  # of the current step
    last_result: Any = None
    op_start: int = 0  # where the current op's events start in `events`
    shown: tuple | None = None  # `show`: (history position, events) the step's picture holds
    bands: list = field(default_factory=list)  # `chain` / `reservation`: rows under the pool


class Player(Protocol):
    """What a verb needs of the runner that plays it."""

    @property
    def engine(self) -> LLMEngine: ...  # to read (snapshot, encode); never to act on

    state: PlayState

    def act(self, op: ops.Op) -> Any: ...  # an engine operation, recorded in the run's history

    def picture_here(self) -> int: ...  # the run's position now, its frame recorded

    def reconfigure(self, settings: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Verb:
    positional: tuple[str, ...]  # argument names; "*" at the end: any number more of the last
    keywords: frozenset[str]  # allowed options (name=value)
    binds: bool  # returns a value `x = verb ...` may bind
    do: Callable[[Player, list[Any], dict[str, Any]], Any]


# ---- engine operations -------------------------------------------------------------------------


def _run(p: Player, op: ops.Op) -> Any:
    """Run one engine operation; its events join the step's."""
    result = p.act(op)
    p.state.events += p.engine.last_events
    return result


def _append(p: Player, args: list[Any], kw: dict[str, Any]) -> None:
    seq = seq_id(args[0])
    if "tokens" in kw:
        op = ops.Append(seq, token_ids=list(kw["tokens"]))
    elif "text" in kw:
        op = ops.Append(seq, token_ids=p.engine.encode(kw["text"]))
    else:
        op = ops.Append(seq, n=kw.get("n", 1))
    _run(p, op)


def _free(p: Player, args: list[Any], kw: dict[str, Any]) -> None:
    events: list[Event] = []
    for a in args:
        p.act(ops.Free(seq_id(a)))
        events += p.engine.last_events
    p.state.events += events


def _request(p: Player, args: list[Any], kw: dict[str, Any]) -> int:
    if "stop" in kw:
        kw["stop"] = tuple([kw["stop"]] if isinstance(kw["stop"], str) else kw["stop"])
    return _run(p, ops.AddRequest(prompt(args[0]), SamplingParams(**kw)))


def _steps(p: Player, kw: dict[str, Any], run: bool) -> list[Any]:
    """`step times=k`, or `run` until no request is left (or `until=` an event of that kind, or of
    that form such as "draft_kept", happened)."""
    st = p.state
    limit = as_int(kw.get("max_steps", MAX_RUN_STEPS) if run else kw.get("times", 1), "steps")
    finished = []
    for _ in range(limit):
        if run and not p.engine.has_pending_work():
            break
        res = p.act(ops.Step())
        st.last_result = res
        st.events += res.events
        for out in list(res.outputs) + list(res.finished):
            st.outputs[out.request_id] = out
        finished += res.finished
        if run and kw.get("until") in {x for e in res.events for x in (e.kind, e.form) if x}:
            break  # `run until="preempt"`: stop right after the step where it happened
    return finished


# ---- lesson verbs ------------------------------------------------------------------------------


def _probe(p: Player, args: list[Any], kw: dict[str, Any]) -> helpers.ProbeResult:
    seq = seq_id(args[0])
    probe = helpers.AttentionProbe(p.engine, as_int(kw.get("layer", 0), "layer"))
    with probe.hooks():
        _run(p, ops.Append(seq, n=1))
    return probe.result(seq)


def _show(p: Player, args: list[Any], kw: dict[str, Any]) -> None:
    """`show`: the page's picture is the engine as it is now, with the events of the last engine
    step of the op before (the copy, the reservation, the drafts, the eviction), not the state
    after the step's last op. The narration is still written after every op ran."""
    st = p.state
    last = st.events[st.op_start:] if st.op_start < len(st.events) else []
    step = max((e.step for e in last), default=None)
    st.shown = (p.picture_here(), tuple(e for e in last if e.step == step))


def _chain(p: Player, args: list[Any], kw: dict[str, Any]) -> None:
    """`chain a`: the page's picture draws sequence a's hash chain under the pool: each full
    block's hash (its first hex digits), chained to the one before it."""
    seq = seq_id(args[0])
    snap = p.engine.snapshot()
    view = snap.sequences.get(seq)
    if view is None:
        raise ValueError(f"sequence {seq} is not live: its hash chain cannot be drawn")
    cells = []
    for j, b in enumerate(view.block_table):
        h = snap.blocks[b].block_hash
        if h is None:
            cells.append((f"#{b} —", 1.0, "reserved",
                          f"logical block {j} → block {b}: partly filled, not hashed"))
            continue
        cells.append((f"#{b} {h & 0xFFF:03x}" + (" →" if j + 1 < len(view.block_table) else ""),
                      1.0, "hash", f"logical block {j} → block {b}: hash {h & 0xFFFFFFFF:08x} = "
                                   f"xxh64(hash of block {j - 1 if j else 'none'}, its tokens)"))
    name = p.state.seq_names.get(seq, f"seq {seq}")
    p.state.bands.append((f"hash chain of {name}: each hash covers its block's tokens and the "
                          f"hash before it", tuple(cells)))


def _reservation(p: Player, args: list[Any], kw: dict[str, Any]) -> None:
    """`reservation r slots=N`: the page's picture draws what a contiguous allocator would have
    reserved for request r (N slots) beside what r used (its prompt and output tokens)."""
    out = p.state.outputs.get(args[0])
    if out is None:
        raise ValueError(f"request {args[0]!r} has no output yet: run it first")
    slots = as_int(kw.get("slots"), "slots")
    used = len(out.prompt_token_ids) + len(out.outputs[0].token_ids)
    if not 0 < used <= slots:
        raise ValueError(f"the request used {used} slots, more than the {slots} reserved")
    cells = ((f"{used} slots used", float(used), f"owner:{as_int(args[0], 'request')}",
              "prompt and output tokens"),
             (f"{slots - used} reserved, never used", float(slots - used), "reserved",
              "reserved for the longest possible output, never written"))
    p.state.bands.append((f"contiguous reservation (Fig. 3): one chunk of {slots} slots", cells))


def _vllm(p: Player, args: list[Any], kw: dict[str, Any]) -> Any:
    """`v = vllm PROMPT max_tokens=1 reset=False`: the prompt's token ids sent to the lab's vLLM
    (engine/vllm/lab.py: one started in the vLLM tab, named by --vllm-events / --vllm-url or by
    PAGEDLAB_VLLM_SERVER; a lesson never starts one), and what its KV events said about it
    (engine.vllm.ask.VllmAnswer). Without a vLLM: an answer with ok False and why, so the lesson
    plays on with PagedLab's half."""
    from engine.vllm import lab
    from engine.vllm.ask import ask, unavailable

    ids = prompt(args[0])
    if isinstance(ids, str):
        ids = p.engine.encode(ids)
    server = lab.current()
    if server is None:
        return unavailable("no vLLM runs beside PagedLab here, so this page shows PagedLab's "
                           "half only: press Start one here in the vLLM tab (it needs vLLM "
                           "installed: scripts/setup_vllm.sh), or start the app with "
                           "--vllm-events and --vllm-url, then play this lesson again")
    return ask(server, ids, max_tokens=as_int(kw.get("max_tokens", 1), "max_tokens"),
               reset=bool(kw.get("reset", False)))


def _engine(p: Player, args: list[Any], kw: dict[str, Any]) -> None:
    p.reconfigure(kw)
    p.state.outputs.clear()


_SAMPLING = frozenset({"max_tokens", "temperature", "top_p", "top_k", "n", "beam_width",
                       "length_penalty", "seed", "stop", "ignore_eos"})

#: verb -> its arguments and what it does
VERBS: dict[str, Verb] = {
    "add_sequence": Verb(("prompt",), frozenset(), True,
                         lambda p, a, kw: _run(p, ops.AddSequence(prompt(a[0])))),
    "append": Verb(("seq",), frozenset({"n", "tokens", "text"}), False, _append),
    "fork": Verb(("seq",), frozenset(), True, lambda p, a, kw: _run(p, ops.Fork(seq_id(a[0])))),
    "free": Verb(("seq", "*"), frozenset(), False, _free),
    "request": Verb(("prompt",), _SAMPLING, True, _request),
    "step": Verb((), frozenset({"times"}), True, lambda p, a, kw: _steps(p, kw, run=False)),
    "run": Verb((), frozenset({"max_steps", "until"}), True, lambda p, a, kw: _steps(p, kw, run=True)),
    "let": Verb(("value",), frozenset(), True, lambda p, a, kw: a[0]),
    "probe": Verb(("seq",), frozenset({"layer"}), True, _probe),
    # hundreds of ops: their events are not shown one by one; the snapshot tells the story
    "admit": Verb(("workload",), frozenset(), True, lambda p, a, kw: helpers.admit(p.act, a[0])),
    "engine": Verb((), ENGINE_KEYS - {"model"}, False, _engine),
    "show": Verb((), frozenset(), False, _show),
    "chain": Verb(("seq",), frozenset(), False, _chain),
    "reservation": Verb(("request",), frozenset({"slots"}), False, _reservation),
    "vllm": Verb(("prompt",), frozenset({"max_tokens", "reset"}), True, _vllm),
}


# ---- values a lesson hands to the engine -------------------------------------------------------


def seq_id(s: Any) -> int:
    """A lesson names a sequence by the id an op bound (the lesson author's message)."""
    if isinstance(s, bool) or not isinstance(s, int):
        raise ValueError(f"a sequence is named by its id (a bound name like a), got {s!r}")
    return s


def as_int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} must be a whole number, got {v!r}")
    return v


def prompt(p: Any) -> str | list[int]:
    if isinstance(p, str):
        return p
    if isinstance(p, list | tuple):
        return list(p)
    raise ValueError(f"a prompt is text or a list of token ids, got {type(p).__name__}")
