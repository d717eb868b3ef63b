"""Byte counts for people: one formatter for the engine's notes, the UI and the lessons."""

from __future__ import annotations


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def mib(n: float) -> str:
    return f"{n / 1024 ** 2:,.1f} MiB"


def gib(n: float) -> str:
    return f"{n / 1024 ** 3:,.2f} GiB"


def human_bytes(n: float) -> str:
    """The largest unit that keeps the number at 1 or more: '737.3 KiB', '1.4 MiB'."""
    if n < 1024:
        return f"{n:.0f} B"
    if n < 1024 ** 2:
        return kib(n)
    return mib(n) if n < 1024 ** 3 else gib(n)
