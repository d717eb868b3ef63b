"""The run over time, request by request: what each serving request (and each of its sequences)
did in each engine step, for the request timeline (viz/timeline.py).

Folded from each step's events alone (`RunRecorder.note`, called by the engine after every
operation): a `prefill` event is a chunk computed, `decode` a token, `draft` / `reject` the kept
and drafted tokens, `preempt` a preemption by swap or recompute, `load` prefix blocks coming back
from the CPU tier, `finish` the end and why, a fork (`share`, form "fork") a new sequence of a
sample or beam group, `free` a sequence that ended before its request. A step records only what
it touched; the states in between follow from the last one (`RequestTimeline.grid`): after a
preemption by recompute a request waits, after one by swap it sits in swap space, after any work
it holds its blocks ("stalled") until its next event. Nothing here reads the scheduler's queues,
and a step's record keeps its decode event's tuple of sequences as it is: recording costs one
pass over the step's events (a serving step of 256 sequences: tens of microseconds); a request's
cell is worked out when a view first reads the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, not_
from typing import Any, NamedTuple

from engine.core.events import Event

#: what a lane's cell can say, in the order a step's several cells for one request rank
STATES = ("waiting", "stalled", "swapped", "freed", "decode", "draft", "prefill", "loading",
          "preempt_recompute", "preempt_swap", "finished")
_RANK = {s: i for i, s in enumerate(STATES)}
#: events that say nothing of a request's state (most of a step's: one per token written)
_OTHER = frozenset(("append", "allocate", "cache", "evict", "cow", "offload", "drop", "swap_out",
                    "prefix_hit"))
_KIND = attrgetter("kind")


class Cell(NamedTuple):
    """One request's (or sequence's) state in one step."""

    state: str  # one of STATES
    tokens: int = 0  # tokens computed (prefill chunk, decodes, kept drafts + 1); blocks swapped
    drafted: int = 0  # draft tokens proposed and verified in the step
    detail: str = ""  # why it finished, "recompute" for a re-prefill, "swapped in", ...


WAITING, STALLED, SWAPPED, DECODE = Cell("waiting"), Cell("stalled"), Cell("swapped"), Cell("decode", 1)
#: the state a lane is in during a step with no event of its own, after a step in `state`
_CARRY = {"waiting": WAITING, "preempt_recompute": WAITING, "preempt_swap": SWAPPED,
          "swapped": SWAPPED}
_ENDS = ("finished", "freed")
_TOKENS = {"decode", "draft"}


class StepCells:
    """What one serving step did: the sequences it decoded (the decode event's own tuple), the
    other sequences' cells, and per request its preemption, its end, its swap-in. The requests'
    cells are worked out on first read (`requests`)."""

    __slots__ = ("step", "decoded", "seqs", "preempted", "finished", "swapped_in", "_owner",
                 "_requests")

    def __init__(self, step: int, decoded: tuple[int, ...], seqs: dict[int, Cell],
                 preempted: dict[int, Cell], finished: dict[int, str],
                 swapped_in: tuple[int, ...], owner: Mapping[int, int]) -> None:
        self.step, self.decoded, self.seqs = step, decoded, seqs
        self.preempted, self.finished, self.swapped_in = preempted, finished, swapped_in
        self._owner = owner  # seq id -> request id (a sequence never changes request)
        self._requests: dict[int, Cell] | None = None

    def seq_cell(self, seq_id: int) -> Cell | None:
        """One sequence's cell in this step (None: no event of its own)."""
        cell = self.seqs.get(seq_id)
        return cell if cell is not None or seq_id not in self.decoded else DECODE

    @property
    def requests(self) -> dict[int, Cell]:
        """Each touched request's cell: its sequences' highest-ranked state, their tokens
        summed (a sequence's end is not its request's), then its preemption or end."""
        if self._requests is None:
            self._requests = self._merge()
        return self._requests

    def _merge(self) -> dict[int, Cell]:
        out: dict[int, Cell] = {}
        owner, seqs = self._owner, self.seqs
        cells = [(s, DECODE) for s in self.decoded if s not in seqs] + list(seqs.items())
        for sid, cell in cells:
            rid = owner.get(sid)
            if rid is None:
                continue
            if cell.state == "freed":
                cell = cell._replace(state="decode")
            prev = out.get(rid)
            if prev is None:
                out[rid] = cell
            elif cell.state == prev.state or {cell.state, prev.state} == _TOKENS:
                # a group's sequences: their work adds up (a draft step is a decode step)
                top = cell if _RANK[cell.state] > _RANK[prev.state] else prev
                out[rid] = top._replace(tokens=prev.tokens + cell.tokens,
                                        drafted=prev.drafted + cell.drafted)
            elif _RANK[cell.state] > _RANK[prev.state]:
                out[rid] = cell
        for rid in {owner[s] for s in self.swapped_in if s in owner}:
            if rid in out:
                cell = out[rid]
                out[rid] = cell._replace(detail=", ".join(filter(None, ("swapped in", cell.detail))))
        out.update(self.preempted)
        for rid, reason in self.finished.items():
            did = out.get(rid)
            out[rid] = Cell("finished", did.tokens if did else 0, did.drafted if did else 0, reason)
        return out

    def __getstate__(self) -> tuple:
        return (self.step, self.decoded, self.seqs, self.preempted, self.finished,
                self.swapped_in, self._owner)  # one map, shared by every step (pickle keeps it one)

    def __setstate__(self, state: tuple) -> None:
        self.__init__(*state)


class Lane(NamedTuple):
    """A request: added at `arrival` (the add_request operation's step), with its sequences in
    the order they were made (a fork's parent in `parents`, the step it was born in `born`)."""

    request_id: int
    arrival: int
    kind: str  # "request", "samples" (n > 1) or "beams" (beam width > 1)
    width: int
    num_prompt_tokens: int
    seq_ids: tuple[int, ...]
    parents: tuple[int | None, ...]
    born: tuple[int, ...]


@dataclass(frozen=True)
class RequestTimeline:
    """Every serving step so far and every request added; `grid` fills in the steps between."""

    steps: tuple[StepCells, ...]
    lanes: tuple[Lane, ...]

    @property
    def columns(self) -> tuple[int, ...]:
        """The engine step number of each serving step, in order."""
        return tuple(s.step for s in self.steps)

    def upto(self, step: int) -> RequestTimeline:
        """The run as it stood after engine step `step`."""
        steps = tuple(s for s in self.steps if s.step <= step)
        lanes = tuple(ln._replace(seq_ids=ln.seq_ids[:k], parents=ln.parents[:k], born=ln.born[:k])
                      for ln in self.lanes if ln.arrival <= step
                      for k in [sum(1 for b in ln.born if b <= step)])
        return RequestTimeline(steps, lanes)

    def grid(self) -> list[list[Cell | None]]:
        """Each lane's cell in each step (None before it arrived and after it ended)."""
        return [_fill([s.requests.get(ln.request_id) for s in self.steps], self.steps,
                      ln.arrival, False) for ln in self.lanes]

    def seq_grid(self, request_id: int) -> list[tuple[int, list[Cell | None]]]:
        """(seq id, its cells) for each sequence of one request, from the step it was born (a
        fork's child from that step on) until it was freed or the request finished."""
        lane = next((ln for ln in self.lanes if ln.request_id == request_id), None)
        if lane is None:
            raise ValueError(f"no request {request_id!r} in this timeline")
        end = next((i for i, s in enumerate(self.steps) if request_id in s.finished), None)
        out = []
        for sid, parent, born in zip(lane.seq_ids, lane.parents, lane.born, strict=True):
            own = [s.seq_cell(sid) for s in self.steps]
            if end is not None:  # the request's end is every one of its sequences'
                own[end] = Cell("finished", own[end].tokens if own[end] else 0, 0,
                                self.steps[end].finished[request_id])
            forked = parent is not None
            out.append((sid, _fill(own, self.steps, born if forked else lane.arrival, forked)))
        return out


def _fill(own: list[Cell | None], steps: tuple[StepCells, ...], start: int,
          from_start: bool) -> list[Cell | None]:
    """One lane across the steps: its own cell where the step touched it, else carried on from
    its last one. It starts after step `start` (at it, for a sequence forked in that step) and
    ends with its first "finished" or "freed" cell."""
    out: list[Cell | None] = []
    prev: Cell | None = None
    for cell, col in zip(own, steps, strict=True):
        if col.step < start or (col.step == start and not from_start) or (
                prev is not None and prev.state in _ENDS):
            out.append(None)
            if prev is not None:
                prev = Cell("finished")  # stays ended
            continue
        if cell is None:
            cell = WAITING if prev is None else _CARRY.get(prev.state, STALLED)
        out.append(cell)
        prev = cell
    return out


class RunRecorder:
    """The engine's record of the run (one per engine; its state goes into checkpoints)."""

    STATE = ("_steps", "_lanes", "_owner")  # declared state (engine/core/state.py)
    FIXED = ()

    def __init__(self) -> None:
        self._steps: list[StepCells] = []
        self._lanes: dict[int, Lane] = {}  # request id -> lane, in arrival order
        self._owner: dict[int, int] = {}  # seq id -> request id (never reused, only added)

    def state(self) -> tuple:
        # every step's record and lane is immutable once made: copying the containers will do
        return tuple(self._steps), dict(self._lanes), dict(self._owner)

    def load_state(self, state: tuple) -> None:
        steps, lanes, owner = state
        self._steps, self._lanes, self._owner = list(steps), dict(lanes), dict(owner)

    def timeline(self) -> RequestTimeline:
        return RequestTimeline(tuple(self._steps), tuple(self._lanes.values()))

    def note(self, op: str, step: int, result: Any, events: list[Event],
             groups: Mapping[int, Any]) -> None:
        """Record one operation: a request added (its lane), or a serving step (its cells)."""
        if op == "add_request":
            group = groups[result]
            params, sid = group.params, group.seqs[0].seq_id
            kind = "beams" if params.beam_width > 1 else "samples" if params.n > 1 else "request"
            self._lanes[result] = Lane(result, step, kind, group.width, len(group.prompt_ids),
                                       (sid,), (None,), (step,))
            self._owner[sid] = result
        elif op == "step":
            self._steps.append(self._fold(step, events))

    def _fold(self, step: int, events: Sequence[Event]) -> StepCells:
        decoded: tuple[int, ...] = ()
        seqs: dict[int, Cell] = {}
        preempted: dict[int, Cell] = {}
        finished: dict[int, str] = {}
        swapped_in: list[int] = []
        # the events this fold reads, picked at C speed (a step's appends, allocations and
        # hashes, thousands in a long prompt's step, are not among them)
        for e in compress(events, map(not_, map(_OTHER.__contains__, map(_KIND, events)))):
            kind = e.kind
            if kind == "decode" and e.seq_id is None:
                decoded = e.block_ids  # the event's own tuple: nothing built per sequence
            elif kind == "prefill":
                f = e.facts
                chunk = "" if f.whole else "last chunk" if f.final else f"{f.rest} to go"
                detail = ", ".join(filter(None, ("recompute" if f.resumed else "", chunk)))
                seqs[e.seq_id] = Cell("prefill", f.computed, 0, detail)
            elif kind == "draft" and e.form == "draft_kept":
                k = len(e.token_ids)
                seqs[e.seq_id] = Cell("draft", k + 1, k)
            elif kind == "reject":
                seqs[e.seq_id] = Cell("draft", e.facts.accepted + 1, e.facts.drafted)
            elif kind == "load":
                seqs.setdefault(e.seq_id, Cell("loading", e.facts.tokens))
            elif kind == "preempt":
                f = e.facts
                state = "preempt_recompute" if f.swapped_blocks is None else "preempt_swap"
                preempted[f.request_id] = cell = Cell(state, f.swapped_blocks or 0, 0,
                                                      "swap space full" if f.fallback else "")
                for sid in f.seqs:
                    seqs[sid] = cell
            elif kind == "swap_in":
                swapped_in += e.facts.seqs
            elif kind == "finish":
                finished[e.facts.request_id] = "abort" if e.form == "abort" else str(e.facts.reason)
            elif kind == "share" and e.form == "fork":
                self._fork(step, e.seq_id, e.facts.parent, seqs, decoded)
            elif kind == "free" and e.seq_id in self._owner:
                done = seqs.get(e.seq_id) or (DECODE if e.seq_id in decoded else None)
                if done is None or not done.state.startswith("preempt"):  # recompute frees too
                    seqs[e.seq_id] = Cell("freed", done.tokens if done else 0)
        return StepCells(step, decoded, seqs, preempted, finished, tuple(swapped_in), self._owner)

    def _fork(self, step: int, child: int, parent: int, seqs: dict[int, Cell],
              decoded: tuple[int, ...]) -> None:
        rid = self._owner.get(parent)
        if rid is None:  # a playground fork of a sequence outside serving
            return
        self._owner[child] = rid
        lane = self._lanes[rid]
        self._lanes[rid] = lane._replace(seq_ids=lane.seq_ids + (child,),
                                         parents=lane.parents + (parent,), born=lane.born + (step,))
        # the child shares its parent's step: the same state, none of its computed tokens
        did = seqs.get(parent) or DECODE
        seqs[child] = did._replace(tokens=0, detail=f"forked from seq {parent}")
