"""A room's settings: what the teacher may choose, checked with messages that say what to fix.

Settings arrive as JSON from the teacher's page or the `/room_open` API, so every field is checked
here (type, range, unknown keys) before an engine is built. The model is one of three names,
never a free id or a path. The limits that protect a shared server (how many students, how many
requests each, how long a prompt) are settings too, bounded by what a server allows.
"""

from __future__ import annotations

import json
import os
import unicodedata
from dataclasses import asdict, dataclass, fields
from typing import Any

from engine import EngineConfig


class RoomError(ValueError):
    """Something a teacher or student can fix (or must accept); the message says which."""


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"environment variable {name}={raw!r} must be a whole number of at least 1")
    return int(raw)


#: rooms open at once on one server (each real-model room holds its own KV pool and a thread)
MAX_ROOMS = _env_int("PAGEDLAB_MAX_ROOMS", 8)
#: seconds without a submission, a teacher action or a step before a room closes itself
ROOM_IDLE_SECONDS = _env_int("PAGEDLAB_ROOM_IDLE_SECONDS", 1800)
#: token slots in a real-model room's pool (SmolLM2 K+V is 45 KiB a token in float32)
MAX_ROOM_POOL_TOKENS = _env_int("PAGEDLAB_MAX_ROOM_POOL_TOKENS", 8192)
#: the most students and requests per student any room may allow
MAX_ROOM_STUDENTS = _env_int("PAGEDLAB_MAX_ROOM_STUDENTS", 200)
MAX_ROOM_REQUESTS_EACH = _env_int("PAGEDLAB_MAX_ROOM_REQUESTS_EACH", 50)

MODELS: dict[str, str | None] = {"default": "default", "tiny-random": "tiny-random", "dry": None}
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
#: who answers a room's prompts: its own PagedLab engine, or the lab's vLLM (classroom/vllm_room.py)
SERVED_BY = ("pagedlab", "vllm")
_ALLOWED_CONTROLS = {"\n", "\t", "\r"}


@dataclass(frozen=True)
class RoomSettings:
    model: str = "default"  # "default" (SmolLM2-135M) | "tiny-random" | "dry"
    block_size: int = 16
    num_blocks: int = 64  # the GPU pool, in blocks
    swap_blocks: int = 64  # CPU swap space, in blocks (0: preemption recomputes)
    system_prompt: str = ""  # put before every student's prompt: the shared prefix
    max_tokens: int = 24  # tokens generated per request
    max_students: int = 80
    requests_per_student: int = 5
    max_prompt_chars: int = 300
    served_by: str = "pagedlab"  # "pagedlab" (the room's own engine) | "vllm" (the lab's vLLM)

    @classmethod
    def parse(cls, data: Any) -> RoomSettings:
        """Settings from a JSON text or an already parsed object; missing keys take defaults."""
        if data is None or (isinstance(data, str) and not data.strip()):
            data = {}
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as err:
                raise RoomError(f"the room settings are not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise RoomError(f"the room settings must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise RoomError(f"unknown room setting(s): {', '.join(map(str, unknown))}; "
                            f"known: {', '.join(sorted(known))}")
        settings = cls(**{k: _whole_if_number(v) for k, v in data.items()})
        settings.check()
        return settings

    def check(self) -> None:
        if self.model not in MODELS:
            raise RoomError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.block_size not in BLOCK_SIZES:
            raise RoomError(f"block size must be one of {', '.join(map(str, BLOCK_SIZES))}, "
                            f"got {self.block_size!r}")
        pool_most = 4096 if self.dry else max(1, MAX_ROOM_POOL_TOKENS // _int(self.block_size))
        _range(self.num_blocks, "pool size (blocks)", 1, pool_most)
        _range(self.swap_blocks, "swap space (blocks)", 0, pool_most)
        _range(self.max_tokens, "max tokens", 1, 512)
        _range(self.max_students, "students", 1, MAX_ROOM_STUDENTS)
        _range(self.requests_per_student, "requests per student", 1, MAX_ROOM_REQUESTS_EACH)
        _range(self.max_prompt_chars, "prompt length (characters)", 1, 4000)
        if not isinstance(self.system_prompt, str) or len(self.system_prompt) > 4000:
            raise RoomError("the system prompt must be text of at most 4000 characters")
        check_text(self.system_prompt, "the system prompt")
        if self.served_by not in SERVED_BY:
            raise RoomError(f"served_by must be one of {', '.join(SERVED_BY)}, got {self.served_by!r}")

    @property
    def dry(self) -> bool:
        return self.model == "dry"

    def engine_config(self, device: str = "auto") -> EngineConfig:
        # Swap when there is swap space (the picture shows blocks sliding to the CPU pool);
        # otherwise a preempted request is recomputed.
        return EngineConfig(model=MODELS[self.model], block_size=self.block_size,
                            num_gpu_blocks=self.num_blocks, num_cpu_blocks=self.swap_blocks,
                            preemption_mode="swap" if self.swap_blocks else "recompute",
                            device="auto" if self.dry else device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_text(text: str, what: str) -> None:
    """Typed text: no lone surrogates and no control characters (they render as nothing)."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff" or (ch not in _ALLOWED_CONTROLS and unicodedata.category(ch) == "Cc"):
            raise RoomError(f"{what} contains the character U+{ord(ch):04X} at position {i}, "
                            f"which cannot be shown; remove it")


def _whole_if_number(value: Any) -> Any:
    """JSON from a browser may carry 16.0 for 16; a fraction stays a float and is refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _range(value: Any, what: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RoomError(f"{what} must be a whole number from {low} to {high}, got {value!r}")
