"""What serving returns: per-request outputs (streamed each step, final when finished)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import Event


@dataclass(frozen=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: tuple[int, ...]
    cumulative_logprob: float
    finish_reason: str | None  # "length" | "eos" | "stop" | "abort" | None while running


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
