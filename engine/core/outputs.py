"""What serving returns: per-request outputs (streamed each step, final when finished)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from engine.core.events import Event


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

    def __reduce__(self) -> tuple:
        """Pickled with its text (decoded now) instead of the tokenizer it would decode with."""
        return CompletionOutput, (self.index, self.token_ids, self.cumulative_logprob,
                                  self.finish_reason, DecodedText(self.text))


class DecodedText:
    """A detokenizer that knows its one text (a pickled output's)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __call__(self, _ids: tuple[int, ...]) -> str:
        return self.text


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt: str | list[int]
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]  # best first (beams sorted by score)
    finished: bool
    num_preemptions: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens drafted for this request
    accepted_tokens: int = 0  # of them, verified and kept as output
    # prompt tokens the prefix cache served when the request was first scheduled (vLLM's
    # RequestOutput.num_cached_tokens); 0 until then
    num_cached_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


class LazyOutputs(Sequence):
    """A step's partial outputs of its running requests, built on first read. A step captures
    only what each output needs (its sequences and how many tokens each had); most callers of
    `step()` never look, and building every output every step costs more than the step."""

    def __init__(self, build: Callable[[], list[RequestOutput]]) -> None:
        self._build: Callable[[], list[RequestOutput]] | None = build
        self._items: list[RequestOutput] = []

    def _get(self) -> list[RequestOutput]:
        if self._build is not None:
            self._items, self._build = self._build(), None
        return self._items

    def __getitem__(self, i):  # type: ignore[override]
        return self._get()[i]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[RequestOutput]:
        return iter(self._get())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(self._get())


@dataclass(frozen=True)
class StepResult:
    step: int
    events: list[Event]
    finished: list[RequestOutput]
    outputs: Sequence[RequestOutput] = field(default_factory=list)  # running requests, so far
    num_batched_tokens: int = 0
    num_prefills: int = 0
    num_decodes: int = 0
