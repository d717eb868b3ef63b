"""The one vocabulary of engine operations: their names, arguments and limits, defined once.

Every operation the engine runs is one of these frozen dataclasses. Each knows its op-log record
(the JSON-ready dict of `LLMEngine.trace`, e.g. `{"op": "append", "seq": 0, "n": 1}`) and is
parsed back from it, so traces and links written before this module existed load unchanged.
Arguments are checked here, once, when an operation is made: what needs the engine (is the
sequence live, is a token in the vocabulary, does the pool have room) the engine checks when it
runs the operation. Deployment limits (ui/limits.py) are a policy on top, not a second check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from engine.core.sequence import SamplingParams

#: tokens one append may add: a bound on one call's work, not on a sequence's length
MAX_APPEND_PER_CALL = 100_000


class OpError(ValueError):
    """An operation's argument is wrong (or its record malformed); the message says how to fix it."""


# ---- argument checks (each argument is checked here and nowhere else) ----------------------------


def seq_id(value: object) -> int:
    """A sequence id: a whole number (whether it is live is the engine's question)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpError(f"a sequence id is a whole number, got {value!r}")
    return value


def token_ids(value: object, what: str) -> tuple[int, ...]:
    """A list of token ids (whether they are in the vocabulary is the engine's question)."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise OpError(f"{what} must be a list of token ids, got {type(value).__name__}")
    if set(map(type, value)) <= {int}:  # the common case, in C: a long prompt costs no loop here
        return tuple(value)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int):
            raise OpError(f"{what}: a token id must be an int, got {t!r}")
    return tuple(value)


def prompt(value: object) -> str | tuple[int, ...]:
    """A prompt: non-blank text, or a non-empty list of token ids."""
    if isinstance(value, str):
        if not value.strip():
            raise OpError("the prompt is empty: type some text to start a sequence")
        return value
    tokens = token_ids(value, "prompt")
    if not tokens:
        raise OpError("the prompt is empty: give at least one token")
    return tokens


def append_count(n: object) -> int:
    """How many model-chosen tokens one append adds."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_APPEND_PER_CALL:
        raise OpError(f"n must be a whole number from 1 to {MAX_APPEND_PER_CALL}, got {n!r}")
    return n


def _record_prompt(p: str | tuple[int, ...]) -> str | list[int]:
    return list(p) if isinstance(p, tuple) else p


# ---- the operations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddSequence:
    """Allocate and prefill a prompt (the prefix cache consulted). Result: the new seq id."""

    prompt: str | tuple[int, ...]
    name: ClassVar[str] = "add_sequence"

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", prompt(self.prompt))

    @property
    def prompt_value(self) -> str | list[int]:
        """The prompt as the caller gave it (a fresh list for token ids)."""
        return _record_prompt(self.prompt)

    def to_record(self) -> dict[str, Any]:
        return {"op": self.name, "prompt": self.prompt_value}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> AddSequence:
        return cls(rec.get("prompt"))


@dataclass(frozen=True)
class Append:
    """Append n model-chosen tokens (the pending one first), or exactly `token_ids`."""

    seq: int
    n: int | None = None  # None with no token_ids: one token
    token_ids: tuple[int, ...] | None = None
    name: ClassVar[str] = "append"

    def __post_init__(self) -> None:
        seq_id(self.seq)
        if self.token_ids is not None:
            if self.n is not None:
                raise OpError("give either n or token_ids to append, not both")
            tokens = token_ids(self.token_ids, "token_ids")
            if not tokens:
                raise OpError("token_ids is empty: give at least one token to append")
            object.__setattr__(self, "token_ids", tokens)
        else:
            object.__setattr__(self, "n", append_count(1 if self.n is None else self.n))

    def to_record(self) -> dict[str, Any]:
        if self.token_ids is not None:
            return {"op": self.name, "seq": self.seq, "token_ids": list(self.token_ids)}
        return {"op": self.name, "seq": self.seq, "n": self.n}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Append:
        if "token_ids" in rec:  # as before this module: token_ids win over a stray n
            return cls(rec.get("seq"), token_ids=rec["token_ids"])
        seq_id(rec.get("seq"))
        return cls(rec.get("seq"), n=append_count(rec.get("n")))  # a record must name its n


@dataclass(frozen=True)
class Fork:
    """A child sharing every block of the parent (ref counts + 1). Result: the child's id."""

    seq: int
    name: ClassVar[str] = "fork"

    def __post_init__(self) -> None:
        seq_id(self.seq)

    def to_record(self) -> dict[str, Any]:
        return {"op": self.name, "seq": self.seq}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Fork:
        return cls(rec.get("seq"))


@dataclass(frozen=True)
class Free:
    """Drop a sequence: every block's ref count - 1; blocks reaching 0 are cached or free."""

    seq: int
    name: ClassVar[str] = "free"

    def __post_init__(self) -> None:
        seq_id(self.seq)

    def to_record(self) -> dict[str, Any]:
        return {"op": self.name, "seq": self.seq}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Free:
        return cls(rec.get("seq"))


@dataclass(frozen=True)
class AddRequest:
    """Queue a serving request; it joins the next step. Result: the request id."""

    prompt: str | tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    name: ClassVar[str] = "add_request"

    def __post_init__(self) -> None:
        if self.params is None:
            object.__setattr__(self, "params", SamplingParams())
        if not isinstance(self.params, SamplingParams):
            raise OpError(f"params must be a SamplingParams, got {type(self.params).__name__}")
        object.__setattr__(self, "prompt", prompt(self.prompt))

    @property
    def prompt_value(self) -> str | list[int]:
        """The prompt as the caller gave it (a fresh list for token ids)."""
        return _record_prompt(self.prompt)

    def to_record(self) -> dict[str, Any]:
        return {"op": self.name, "prompt": self.prompt_value, "params": asdict(self.params)}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> AddRequest:
        params = rec.get("params") or {}
        if not isinstance(params, dict):
            raise OpError("params must be an object of sampling parameters")
        try:  # a JSON trace holds `stop` as a list
            params = SamplingParams(**{k: tuple(v) if k == "stop" else v for k, v in params.items()})
        except TypeError as err:  # an unknown field: the trace's problem, said as such
            raise OpError(f"params: {err}") from None
        return cls(rec.get("prompt"), params)


@dataclass(frozen=True)
class Step:
    """One scheduler iteration: schedule, run, postprocess. Result: a StepResult."""

    name: ClassVar[str] = "step"

    def to_record(self) -> dict[str, Any]:
        return {"op": self.name}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Step:
        return cls()


@dataclass(frozen=True)
class SetPrefixCaching:
    """Prefix caching on or off from now on (blocks cached so far keep their hash)."""

    enabled: bool
    name: ClassVar[str] = "set_prefix_caching"

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise OpError(f"enabled must be True or False, got {self.enabled!r}")

    def to_record(self) -> dict[str, Any]:
        return {"op": self.name, "enabled": self.enabled}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> SetPrefixCaching:
        return cls(rec.get("enabled"))


Op = AddSequence | Append | Fork | Free | AddRequest | Step | SetPrefixCaching

#: op-log name -> operation class
BY_NAME: dict[str, type] = {c.name: c for c in (AddSequence, Append, Fork, Free, AddRequest, Step,
                                                 SetPrefixCaching)}


def parse(record: object) -> Op:
    """The operation an op-log record describes; a ValueError names what is wrong with it."""
    kind = record.get("op") if isinstance(record, dict) else None
    cls = BY_NAME.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise OpError(f"unknown operation {record!r:.80}; expected one of {sorted(BY_NAME)}")
    return cls.from_record(record)


def as_op(op_or_record: object) -> Op:
    """An operation as given, or parsed from its op-log record."""
    return op_or_record if isinstance(op_or_record, tuple(BY_NAME.values())) else parse(op_or_record)
