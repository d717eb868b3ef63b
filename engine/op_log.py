"""The op log on paper: an exported trace (`LLMEngine.export_trace`) is the config it ran under
and every operation that succeeded, as JSON-ready records; replaying it on a new engine of that
config rebuilds the same state. This module owns the format and the replay loop's errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config import EngineConfig
from engine.core.block_pool import OutOfBlocks

TRACE_VERSION = 1


def export(config: EngineConfig, ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The trace of a run: its config and its op records."""
    return {"version": TRACE_VERSION, "config": config.to_dict(), "ops": ops}


def parse(data: Any) -> tuple[EngineConfig, list[dict[str, Any]]]:
    """(config, op records) of an exported trace; ValueError naming what is wrong otherwise."""
    if not isinstance(data, dict) or data.get("version") != TRACE_VERSION:
        raise ValueError(f"not a PagedLab trace (expected an object with version "
                         f"{TRACE_VERSION}, config and ops)")
    return EngineConfig.from_dict(data.get("config")), data.get("ops")


def check_ops(ops: Any) -> None:
    """Raise ValueError unless `ops` is a list (checked before an engine is built for it)."""
    if not isinstance(ops, list):
        raise ValueError(f"a trace is a list of operations, got {type(ops).__name__}")


def run(apply: Callable[[dict[str, Any]], Any], ops: list[dict[str, Any]]) -> None:
    """Apply each record in turn; the first that fails raises ValueError naming it."""
    for i, op in enumerate(ops):
        try:
            apply(op)
        except (ValueError, OutOfBlocks) as e:
            raise ValueError(f"trace operation {i} ({op!r:.80}) failed on replay: {e}") from e
