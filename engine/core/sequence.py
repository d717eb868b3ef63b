"""Sequences (a block table each, or one per KV cache group), their status, and the sampling
parameters of a request.

A sequence's `token_ids` are the tokens whose K/V are in the cache. A token the model sampled
but has not yet fed back waits as `pending_token`, in no slot (the paper's Fig. 6).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

#: async scheduling: the token a sequence sampled in the step still on the GPU, written into its
#: slot (and block) before the host knows it; the postprocess puts the real id in when the step lands
IN_FLIGHT = -1


class SequenceStatus(str, Enum):
    WAITING = "waiting"  # queued for (re-)prefill; holds no blocks
    RUNNING = "running"  # holds blocks in the GPU pool
    SWAPPED = "swapped"  # preempted by swap: its blocks live in CPU swap space
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    token_ids: list[int] = field(default_factory=list)
    # logical block i -> physical block id, one table per KV cache group (engine/core/kv_groups.py;
    # most models have one); None where a sliding-window group dropped a block
    block_tables: list[list[int | None]] = field(default_factory=lambda: [[]])
    block_hashes: list[int] = field(default_factory=list)  # chain hash of each full block
    pending_token: int | None = None
    prompt_len: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    parent_id: int | None = None
    status: SequenceStatus = SequenceStatus.RUNNING
    cumulative_logprob: float = 0.0
    # serving only
    request_id: int | None = None  # the request group this sequence belongs to
    output_ids: list[int] = field(default_factory=list)  # every sampled token, the pending one too
    resume_tokens: list[int] = field(default_factory=list)  # tokens to recompute after preemption
    # chunked prefill: prompt tokens admitted but not computed yet; they enter the cache (and
    # token_ids) a chunk a step, and the sequence decodes only once this is empty
    prefill_rest: list[int] = field(default_factory=list)
    # async scheduling: the step whose sampled token for this sequence is not read back yet
    # (-1: none), and its row in that step's outputs (the next step's input reads it there)
    inflight_step: int = -1
    inflight_row: int = -1
    finish_reason: str | None = None  # "length" | "stop" | "eos"
    # speculative decoding: draft tokens at the end of token_ids whose slots are reserved for
    # this step's verification (0 between steps: the postprocess keeps or rolls back each one)
    num_draft: int = 0
    # serving with the CPU tier: its prefix blocks are being copied back; it computes the rest of
    # its prompt from the next step on (engine/runtime/tier_copies.py)
    loading: bool = False
    drafting: Any = None  # its n-gram index and lookups' back-off (engine/core/draft_policy.py)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def block_table(self) -> list[int | None]:
        """The first group's table: full attention where the model has any (the only table of
        most models). Read-only: the KV cache manager changes every group's table together."""
        return self.block_tables[0]

    def holds_blocks(self) -> bool:
        return bool(self.block_tables[0])

    def copy(self) -> Sequence:
        """A copy that shares nothing an operation changes (a checkpoint's: its lists are
        copied, its drafting state too; the rest are numbers, text and enums)."""
        new = copy.copy(self)
        for name in _LISTS:
            setattr(new, name, list(getattr(self, name)))
        new.block_tables = [list(t) for t in self.block_tables]
        if self.drafting is not None:
            new.drafting = self.drafting.copy()
        return new


#: the lists of a sequence that `Sequence.copy` copies (block_tables, a list of lists, apart)
_LISTS = ("token_ids", "block_hashes", "output_ids", "resume_tokens", "prefill_rest")


def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_float(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or not low <= v <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value!r}")
    return v


@dataclass(frozen=True)
class SamplingParams:
    """How to continue a request. Validated on creation, with messages that say what to fix."""

    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    n: int = 1  # parallel samples, forked from one prefill
    beam_width: int = 1  # > 1 = beam search
    length_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, 1, 1_000_000)
        object.__setattr__(self, "temperature", _check_float("temperature", self.temperature, 0, 100))
        object.__setattr__(self, "top_p", _check_float("top_p", self.top_p, 0, 1))
        if self.top_p == 0:
            raise ValueError("top_p must be > 0 (1.0 keeps every token)")
        _check_int("top_k", self.top_k, 0)
        _check_int("n", self.n, 1, 64)
        _check_int("beam_width", self.beam_width, 1, 64)
        object.__setattr__(
            self, "length_penalty", _check_float("length_penalty", self.length_penalty, -10, 10)
        )
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1)
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.beam_width > 1 and self.n > 1:
            raise ValueError("use either n > 1 (parallel sampling) or beam_width > 1, not both")
        if self.beam_width > 1 and self.temperature > 0:
            raise ValueError("beam search is deterministic: set temperature=0 with beam_width > 1")


@dataclass
class SequenceGroup:
    """One request: a prompt and the sequences that continue it (1, n samples, or beams).
    Scheduled and preempted as a whole ("gang-scheduled"), as the paper does."""

    request_id: int
    prompt: str | list[int]
    prompt_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival: int  # FCFS order
    prefilled: bool = False  # the first prefill (which samples the first token) has run
    # preempted by recompute before its first prefill ended: that prefill, run again, is a
    # recompute (its prompt is counted once, its hits on its own blocks are no prompt's hits)
    recomputed: bool = False
    finished_beams: list[Any] = field(default_factory=list)  # beam_search.Hypothesis: beams ended
    finished_seqs: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    draft_tokens: int = 0  # speculative decoding: proposed for this request, cumulative
    accepted_tokens: int = 0  # of them, verified and kept as output
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served at its first admission
    seed: int | None = None  # sampling: the scrambled seed (given, or from the engine's seed)

    @property
    def width(self) -> int:
        """How many sequences the group runs once it is going."""
        return max(self.params.n, self.params.beam_width)

    def copy(self, seq: Callable[[Sequence], Sequence]) -> SequenceGroup:
        """A copy for a checkpoint, its sequences given by `seq` (the copy of each sequence,
        shared by every table of requests and sequences that holds it)."""
        prompt = list(self.prompt) if isinstance(self.prompt, list) else self.prompt
        return replace(self, prompt=prompt, prompt_ids=list(self.prompt_ids),
                       seqs=[seq(s) for s in self.seqs],
                       finished_seqs=[seq(s) for s in self.finished_seqs],
                       finished_beams=[replace(h, token_ids=list(h.token_ids))
                                       for h in self.finished_beams])

    def live(self) -> list[Sequence]:
        seqs = self.seqs
        if len(seqs) == 1:  # most requests: no comprehension in the per-step hot path
            return [seqs[0]] if seqs[0].status is not SequenceStatus.FINISHED else []
        return [s for s in seqs if s.status is not SequenceStatus.FINISHED]
