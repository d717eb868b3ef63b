"""What one session of a public PagedLab may ask for, and the messages that say so.

Every limit reads an environment variable at import, so a classroom server can raise them and a
public Space keeps the safe defaults. A malformed variable stops the app at start (a typo must
not silently become "no limit"). The checks raise `UserError`: the UI shows its message in a box
and the session stays as it was.

What is deliberately NOT reachable from any input: a model id or local path other than
ALLOWED_MODELS (a trace or the engine dropdown can only name those), a file path (an imported
trace arrives as bytes; exported traces go to a fresh temp file), `eval` (lessons use their own
safe evaluator on repo files, never on user text) and `pickle` (only ZeroGPU's own worker
handoff pickles a session, which is our object, never user bytes).
"""

from __future__ import annotations

import math
import os
import unicodedata
from typing import Any

from engine import ops


class UserError(ValueError):
    """Something the user can fix; its message says how."""


def _env_int(name: str, default: int, low: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a whole number") from None
    if value < low:
        raise ValueError(f"environment variable {name}={value} must be at least {low}")
    return value


#: characters in one prompt (a 100k-character paste is refused before it is tokenized)
MAX_PROMPT_CHARS = _env_int("PAGEDLAB_MAX_PROMPT_CHARS", 4000)
#: tokens in one prompt (the engine also refuses prompts longer than its pool)
MAX_PROMPT_TOKENS = _env_int("PAGEDLAB_MAX_PROMPT_TOKENS", 1024)
#: operations kept per session: replaying more would make Back and undo slow
MAX_OPS = _env_int("PAGEDLAB_MAX_OPS", 2000)
#: tokens one Append click may add (a real-model token costs tens of ms on a CPU)
MAX_APPEND = _env_int("PAGEDLAB_MAX_APPEND", 256)
#: requests added per session (each may run hundreds of model steps)
MAX_REQUESTS = _env_int("PAGEDLAB_MAX_REQUESTS", 64)
#: requested tokens per request, samples (n) and beam width, as the UI's number boxes allow
MAX_REQUEST_TOKENS = _env_int("PAGEDLAB_MAX_REQUEST_TOKENS", 512)
MAX_SAMPLES = _env_int("PAGEDLAB_MAX_SAMPLES", 16)
MAX_BEAM_WIDTH = _env_int("PAGEDLAB_MAX_BEAM_WIDTH", 8)
#: physical blocks in a dry pool (bookkeeping only: cheap)
MAX_DRY_BLOCKS = _env_int("PAGEDLAB_MAX_DRY_BLOCKS", 4096)
#: token slots in a real-model pool; SmolLM2 K+V is 45 KiB a token in float32, so 4096 slots
#: hold ~180 MiB per session
MAX_REAL_POOL_TOKENS = _env_int("PAGEDLAB_MAX_REAL_POOL_TOKENS", 4096)
#: block sizes the UI offers (the kernels take 1..128)
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
# tensor-parallel sizes a session may start: each rank is a process holding a model shard (off
# by default on ZeroGPU, whose forked GPU worker is no place to start processes)
_ZEROGPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")
TP_SIZES = (1, 3) if _env_int("PAGEDLAB_ALLOW_TENSOR_PARALLEL", 0 if _ZEROGPU else 1, low=0) else (1,)
#: sessions holding an engine at once (each real-model session holds its own KV pool)
MAX_SESSIONS = _env_int("PAGEDLAB_MAX_SESSIONS", 64)
#: MiB the sessions' engines may hold together (KV pools, swap, CPU tier and checkpoints: a
#: session counts twice its pool; ui/session_budget.py). 6 GiB leaves a 16 GB CPU-basic Space
#: room for the process, the model and the classroom rooms (README, "On a Hugging Face Space")
MEMORY_BUDGET_MB = _env_int("PAGEDLAB_MEMORY_BUDGET_MB", 6144)
#: events the app runs at once, and events that may wait in its queue (a Space's 2 vCPUs: more
#: at once only thrash; past the queue's size a visitor is told the app is busy)
QUEUE_CONCURRENCY = _env_int("PAGEDLAB_QUEUE_CONCURRENCY", 4)
QUEUE_MAX_SIZE = _env_int("PAGEDLAB_QUEUE_MAX_SIZE", 64)
#: on a ZeroGPU Space, serving work the CPU would take longer than this for goes to the GPU (0:
#: every run and every serving click after one), and the longest GPU call asked for (an unsigned
#: visitor has 120 s a day; ui/gpu_jobs.py)
GPU_AFTER_SECONDS = _env_int("PAGEDLAB_GPU_AFTER_SECONDS", 8, low=0)
GPU_MAX_SECONDS = _env_int("PAGEDLAB_GPU_MAX_SECONDS", 60)
#: a session idle this long lets go of its engine (its log and views stay; it rebuilds on use)
SESSION_IDLE_SECONDS = _env_int("PAGEDLAB_SESSION_IDLE_SECONDS", 900)
#: ... or this long, when a new engine needs the room
SESSION_PRESSURE_IDLE_SECONDS = _env_int("PAGEDLAB_SESSION_PRESSURE_IDLE_SECONDS", 120, low=0)
#: an imported trace file or link, in bytes
MAX_TRACE_BYTES = _env_int("PAGEDLAB_MAX_TRACE_BYTES", 1 << 20)
#: scheduler steps of one "Run to the end" click
MAX_RUN_STEPS = _env_int("PAGEDLAB_MAX_RUN_STEPS", 512)
#: one more model (an HF id or a local folder) offered beside the built-in ones: set by
#: `python app.py --model NAME_OR_PATH` on one's own machine, or by a deployment's operator
EXTRA_MODEL: str | None = os.environ.get("PAGEDLAB_MODEL", "").strip() or None
#: models a session may choose; a public deployment must not load arbitrary ids or paths
ALLOWED_MODELS: tuple[str | None, ...] = ("default", "tiny-random", "tiny-hybrid", None) + (
    (EXTRA_MODEL,) if EXTRA_MODEL else ())

_ALLOWED_CONTROLS = {"\n", "\t", "\r"}


def whole(value: Any, what: str, low: int, high: int) -> int:
    """A whole number from a number box or the API: None, NaN, text, 2.5 and out-of-range values
    get a message naming the box and its range (Gradio hands over floats, strings via the API)."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            value = None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            value = None
        else:
            value = int(value)
    if not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{what} must be a whole number from {low} to {high}")
    return value


def number(value: Any, what: str, low: float, high: float) -> float:
    """A finite number in [low, high]; anything else gets a message naming the box."""
    try:
        v = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v) or not low <= v <= high:
        raise UserError(f"{what} must be a number from {low:g} to {high:g}")
    return v


def check_prompt(prompt: Any, what: str = "prompt") -> None:
    """Text a user typed into the field `what`: not too long, valid Unicode, no control characters
    (a NUL or an escape sequence in a prompt is never intended and renders as nothing in the block
    labels). An over-long prompt is refused whole, never cut: the text boxes set no max_length, so
    the browser does not cut a paste silently either."""
    if not isinstance(prompt, str):
        return  # token-id lists are the engine's to check
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"{what} is {len(prompt):,} characters; the most is {MAX_PROMPT_CHARS:,}")
    for i, ch in enumerate(prompt):
        if "\ud800" <= ch <= "\udfff":
            raise UserError(f"{what} is not valid text: a lone surrogate (U+{ord(ch):04X}) at "
                            f"character {i}; paste it again as plain text")
        if ch not in _ALLOWED_CONTROLS and unicodedata.category(ch) == "Cc":
            raise UserError(f"{what} contains the control character U+{ord(ch):04X} at "
                            f"character {i}; remove it")


def check_prompt_tokens(num_tokens: int, what: str = "prompt") -> None:
    if num_tokens > MAX_PROMPT_TOKENS:
        raise UserError(f"{what} is {num_tokens:,} tokens; the most is {MAX_PROMPT_TOKENS:,}")


def check_config(config: Any) -> None:
    """An engine a session may build: an allowed model, an offered block size, a bounded pool."""
    if config.model not in ALLOWED_MODELS:
        extra = f", {EXTRA_MODEL!r}" if EXTRA_MODEL else ""
        raise UserError(f"model {config.model!r} is not available here; PagedLab runs only "
                        f"'default', 'tiny-random', 'tiny-hybrid'{extra} or the dry mode")
    if getattr(config, "tensor_parallel_size", 1) not in TP_SIZES:
        raise UserError(f"tensor parallel size {config.tensor_parallel_size} is not offered here; "
                        f"choose one of {', '.join(map(str, TP_SIZES))}")
    if config.block_size not in BLOCK_SIZES:
        raise UserError(f"block size {config.block_size} is not offered; choose one of "
                        f"{', '.join(map(str, BLOCK_SIZES))}")
    blocks = config.num_gpu_blocks
    if config.dry:
        if blocks > MAX_DRY_BLOCKS or config.num_cpu_blocks > MAX_DRY_BLOCKS:
            raise UserError(f"a dry pool holds at most {MAX_DRY_BLOCKS} blocks, got {blocks}")
    else:
        most = max(1, MAX_REAL_POOL_TOKENS // config.block_size)
        if blocks is None or blocks > most or config.num_cpu_blocks > most:
            raise UserError(f"a real-model pool holds at most {MAX_REAL_POOL_TOKENS} tokens: at "
                            f"block size {config.block_size} that is {most} blocks, got {blocks}")


def check_op(op: Any, eng: Any, before: list[dict[str, Any]]) -> None:
    """An operation within the per-session limits above (a deployment's policy, on top of what
    the operation itself checks), for a click, for every op of a trace and inside a GPU call;
    `eng` counts a prompt's tokens (None: not yet), `before` is the log before the op."""
    if isinstance(op, ops.AddSequence | ops.AddRequest):
        check_prompt(op.prompt)
        if isinstance(op.prompt, str) and eng is not None:
            check_prompt_tokens(len(eng.encode(op.prompt)))
        elif not isinstance(op.prompt, str):
            check_prompt_tokens(len(op.prompt))
    if isinstance(op, ops.Append):
        count = op.n if op.token_ids is None else len(op.token_ids)
        if count > MAX_APPEND:
            raise UserError(f"append adds at most {MAX_APPEND} tokens at a time, got {count}")
    if isinstance(op, ops.AddRequest):
        done = sum(1 for o in before if isinstance(o, dict) and o.get("op") == "add_request")
        if done >= MAX_REQUESTS:
            raise UserError(f"this session has added {done} requests, the most it may; "
                            "press Reset to start again")
        for key, most in (("max_tokens", MAX_REQUEST_TOKENS), ("n", MAX_SAMPLES),
                          ("beam_width", MAX_BEAM_WIDTH)):
            value = getattr(op.params, key)
            if value > most:
                raise UserError(f"{key} is at most {most} here, got {value}")
