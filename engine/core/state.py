"""Declared state: what each part of the engine's bookkeeping holds, and how a checkpoint copies it.

A checkpoint (engine/checkpoint.py) is the sum of its parts' states, never a copy of whatever
hangs off an object. So each part says, as class attributes, which of its attributes are its
STATE (what an operation changes: a checkpoint copies it), which are FIXED (sizes, settings,
the parts and functions it was given when it was made: shared, never copied) and which are
DERIVED (caches and change logs kept for readers: rebuilt, never copied), and implements
`state()` (its state as data it does not share: a later operation cannot change it) and
`load_state(data)` (back to it, in place: the parts that hold this one keep holding it; the data
stays usable for another load). `undeclared` names an attribute that is neither, which the tests
refuse, so a new attribute cannot silently escape a checkpoint or break it.

`copied` is the copy rule for plain data (numbers, text, enums, and lists, tuples, dicts, sets
and deques of them); anything else is refused, so a part's state can never pull a model, a
runtime or a lock into a checkpoint by accident.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from enum import Enum
from typing import Any, ClassVar, Protocol

_ATOMS = (int, float, str, bytes, bool, type(None), Enum)


class Stateful(Protocol):
    """A part of the bookkeeping that says what its state is and how it is copied."""

    STATE: ClassVar[tuple[str, ...]]  # attributes a checkpoint copies
    FIXED: ClassVar[tuple[str, ...]]  # attributes set when it was made, shared, never copied
    # (optional) PARTS: attributes holding parts that say their own state (a checkpoint takes
    # theirs); DERIVED: attributes kept for readers (caches, change logs): never copied, reset
    # by `load_state`

    def state(self) -> Any: ...

    def load_state(self, state: Any) -> None: ...


def undeclared(obj: object) -> list[str]:
    """The attributes of `obj` that its class declares neither STATE nor FIXED."""
    cls = type(obj)
    kinds = ("STATE", "PARTS", "FIXED", "DERIVED")
    declared = {n for kind in kinds for n in getattr(cls, kind, ())}
    return sorted(set(vars(obj)) - declared)


def copied(value: Any) -> Any:
    """A copy of plain data that shares nothing mutable with `value` (TypeError for anything
    that is not plain data: a part's state never holds objects it does not own)."""
    if isinstance(value, _ATOMS):
        return value
    t = type(value)
    if t is list:
        return [copied(v) for v in value]
    if t is tuple:
        return tuple(copied(v) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple of plain data
        return t(*(copied(v) for v in value))
    if t is dict or t is OrderedDict:
        return t((copied(k), copied(v)) for k, v in value.items())
    if t is deque:
        return deque(copied(v) for v in value)
    if t is set or t is frozenset:
        return t(copied(v) for v in value)
    raise TypeError(f"not plain data: a {t.__name__} cannot be part of a checkpoint's state")


def fields_state(obj: Stateful) -> dict[str, Any]:
    """`obj`'s STATE attributes, copied (the state of a part whose state is plain data)."""
    return {name: copied(getattr(obj, name)) for name in type(obj).STATE}


def load_fields(obj: Stateful, state: dict[str, Any]) -> None:
    """Back to `fields_state(obj)`'s data, copied again (the data stays usable)."""
    for name in type(obj).STATE:
        setattr(obj, name, copied(state[name]))
