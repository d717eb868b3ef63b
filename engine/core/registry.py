"""Who is alive: the engine's sequences and requests by id, and the ids handed out so far.

The primitives (add_sequence, fork, free) and the serving postprocess (forks of samples and
beams, sequences that finish) both create and end sequences; they share this one register, so a
sequence id is never handed out twice and an id that was freed gets a clear error later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


class RegistryState(NamedTuple):
    """The registry's state (`Registry.state`): copies of its sequences and requests."""

    seqs: dict[int, Sequence]
    groups: dict[int, SequenceGroup]
    freed: dict[int, int]
    next_seq_id: int
    next_request_id: int


def copy_requests(seqs: dict[int, Sequence], groups: dict[int, SequenceGroup]
                  ) -> tuple[dict[int, Sequence], dict[int, SequenceGroup]]:
    """Copies of the sequences and the requests, each sequence copied once and shared by every
    request and table that holds it (a sequence id is never handed out twice), orders kept."""
    made: dict[int, Sequence] = {}

    def copy_of(seq: Sequence) -> Sequence:
        new = made.get(seq.seq_id)
        if new is None:
            new = made[seq.seq_id] = seq.copy()
        return new

    new_groups = {rid: g.copy(copy_of) for rid, g in groups.items()}
    return {sid: copy_of(s) for sid, s in seqs.items()}, new_groups


@dataclass
class Registry:
    seqs: dict[int, Sequence] = field(default_factory=dict)  # every sequence not yet ended
    groups: dict[int, SequenceGroup] = field(default_factory=dict)  # requests not yet finished
    freed: dict[int, int] = field(default_factory=dict)  # seq id -> step it ended at
    next_seq_id: int = 0
    next_request_id: int = 0

    # declared state (engine/core/state.py): all of it; its dicts are loaded in place (the parts
    # that were given them keep them)
    STATE = ("seqs", "groups", "freed", "next_seq_id", "next_request_id")
    FIXED = ()

    def state(self) -> RegistryState:
        seqs, groups = copy_requests(self.seqs, self.groups)
        return RegistryState(seqs, groups, dict(self.freed), self.next_seq_id, self.next_request_id)

    def load_state(self, state: RegistryState) -> None:
        seqs, groups = copy_requests(state.seqs, state.groups)  # the state stays usable
        for mine, theirs in ((self.seqs, seqs), (self.groups, groups), (self.freed, state.freed)):
            mine.clear()
            mine.update(theirs)
        self.next_seq_id, self.next_request_id = state.next_seq_id, state.next_request_id

    def new_seq(self, **fields: object) -> Sequence:
        """A sequence with the next id, registered. Callers that can still fail (an allocation
        that may raise) build `Sequence(registry.next_seq_id)` first and `add` it after."""
        return self.add(Sequence(self.next_seq_id, **fields))  # type: ignore[arg-type]

    def add(self, seq: Sequence) -> Sequence:
        assert seq.seq_id == self.next_seq_id, "sequence ids are handed out in order"
        self.next_seq_id += 1
        self.seqs[seq.seq_id] = seq
        return seq

    def end(self, seq: Sequence, step: int) -> None:
        """The sequence is over (its blocks already let go): remember when, for errors."""
        seq.status = SequenceStatus.FINISHED
        self.seqs.pop(seq.seq_id, None)
        self.freed[seq.seq_id] = step

    def live(self, seq_id: int) -> Sequence:
        """The running sequence with this id (a whole number: engine/ops.py checked it), or a
        ValueError that says why there is none."""
        seq = self.seqs.get(seq_id)
        if seq is not None and seq.status == SequenceStatus.RUNNING:
            return seq
        if seq is not None:  # a request's sequence the scheduler holds outside the pool
            where = {SequenceStatus.WAITING: "waiting for its first step (it has no blocks yet)",
                     SequenceStatus.SWAPPED: "swapped out to the CPU (its blocks are not in the pool)"}
            raise ValueError(f"seq {seq_id} of request {seq.request_id} is "
                             f"{where.get(seq.status, seq.status.value)}; step the engine until it "
                             f"runs, then use it")
        if seq_id in self.freed:
            raise ValueError(f"seq {seq_id} was freed at step {self.freed[seq_id]}; "
                             f"it has no blocks any more")
        live = ", ".join(map(str, self.seqs)) or "none"
        raise ValueError(f"unknown sequence id {seq_id} (live sequences: {live})")
