"""What serving returns: per-request outputs (streamed each step, final when finished)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from engine.events import Event


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    token_ids: tuple[int, ...]
    cumulative_logprob: float
    finish_reason: str | None  # "length" | "eos" | "stop" | "abort" | None while running
    detokenize: Callable[[tuple[int, ...]], str] = field(repr=False, compare=False)

    @cached_property
    def text(self) -> str:
        """Decoded on first read: a step streams every running request's output, and decoding
        them all each step would cost more than the step's forward pass."""
        return self.detokenize(self.token_ids)


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt: str | list[int]
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]  # best first (beams sorted by score)
    finished: bool
    num_preemptions: int = 0


@dataclass(frozen=True)
class StepResult:
    step: int
    events: list[Event]
    finished: list[RequestOutput]
    outputs: list[RequestOutput] = field(default_factory=list)  # partial text of running requests
    num_batched_tokens: int = 0
    num_prefills: int = 0
    num_decodes: int = 0
