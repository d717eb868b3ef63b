"""A stand-in for Hugging Face's `spaces` package (0.51.3) that enforces ZeroGPU's contract on a
machine without a GPU: the simulated Space of tests/space/. Never shipped (it lives under tests/
and is put on PYTHONPATH by the tests that serve the app under it).

What it does, as `spaces/zero/` does (read from its source: zero/__init__.py, zero/wrappers.py,
zero/torch/patching.py, zero/client.py), when SPACES_ZERO_GPU is true:

- at import, raises ZeroGPU's own RuntimeError if CUDA was initialised before it (and records
  whether torch was imported before it, which the docs forbid);
- patches torch in the main process: `is_available()` says True and the device queries answer
  with constants (ZeroGPU emulates CUDA there), while CUDA's initialisation (`_lazy_init`,
  `_C._cuda_init`) raises and is recorded, so a test can assert it was never reached. ZeroGPU
  also emulates tensors placed on `cuda` in the main process; with a CPU-only torch this cannot,
  and such a placement raises here (the app only places weights on cuda where torch has CUDA);
- `GPU(fn, duration=...)`: each call is scheduled against a quota (per visitor's address, as an
  unsigned visitor's is): a duration over the maximum or over what is left is refused with
  ZeroGPU's message. Its arguments are pickled here, the call runs in a FORKED child (torch
  unpatched there: the "GPU" is whatever the machine has), the result comes back pickled. A
  gr.Error raised in the child reaches the visitor as it is; any other exception becomes
  gr.Error("<its class name>", title="ZeroGPU worker error"), as ZeroGPU maps it; a child that
  outlives its duration is killed ("GPU task aborted"). The quota is charged the seconds used.

Every call and every CUDA initialisation goes as a JSON line to $SPACES_SIM_LOG (if set).
Settings: SPACES_SIM_QUOTA_SECONDS (120: an unsigned visitor's day), SPACES_SIM_MAX_DURATION
(120), SPACES_SIM_GRACE_SECONDS (a killed call's slack, 2).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["GPU"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "t", "true")


ZERO_GPU = _flag("SPACES_ZERO_GPU")
_LOG_LOCK = threading.Lock()


def record(event: dict[str, Any]) -> None:
    """One JSON line for the tests ($SPACES_SIM_LOG)."""
    path = os.environ.get("SPACES_SIM_LOG")
    if not path:
        return
    with _LOG_LOCK, open(path, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "time": time.time(), **event}) + "\n")


# ---- torch: CUDA emulated in the main process, never initialised ------------------------------

_SAVED: dict[str, Any] = {}


def _cuda_init_raise(*_: Any, **__: Any) -> None:
    record({"event": "cuda_init", "stack": "".join(traceback.format_stack(limit=12))})
    raise RuntimeError("Low-level CUDA init (`torch._C._cuda_init`) reached. This means ZeroGPU's "
                       "PyTorch CUDA emulation mode did not intercept a CUDA operation in your code.")


def _patch(torch: Any) -> None:
    """ZeroGPU's main-process patches (zero/torch/patching.py: patch)."""
    cuda = torch.cuda
    constants = {"is_available": lambda: True, "device_count": lambda: 1,
                 "current_device": lambda: 0, "synchronize": lambda *a, **k: None,
                 "get_device_capability": lambda *a, **k: (9, 0),
                 "get_device_name": lambda *a, **k: "ZeroGPU (simulated)",
                 "_lazy_init": _cuda_init_raise}
    for name, value in constants.items():
        _SAVED[f"cuda.{name}"] = getattr(cuda, name)
        setattr(cuda, name, value)
    if hasattr(torch._C, "_cuda_init"):
        _SAVED["C._cuda_init"] = torch._C._cuda_init
        torch._C._cuda_init = _cuda_init_raise


def _unpatch(torch: Any) -> None:
    """What a ZeroGPU worker does first (zero/wrappers.py: worker_init -> torch.unpatch)."""
    for key, value in _SAVED.items():
        owner, name = key.split(".", 1)
        setattr(torch.cuda if owner == "cuda" else torch._C, name, value)


def _start() -> None:
    before = "torch" in sys.modules
    import torch

    record({"event": "import", "torch_imported_before": before})
    if torch.cuda.is_initialized():  # zero/__init__.py: torch.is_in_bad_fork()
        raise RuntimeError("CUDA has been initialized before importing the `spaces` package. "
                           "Try importing `spaces` before any other CUDA-related package.")
    _patch(torch)


# ---- the quota (zero/client.py: schedule) ----------------------------------------------------

class Quota:
    """Seconds of GPU left per visitor (by address, as for an unsigned visitor)."""

    def __init__(self, seconds: float, max_duration: float) -> None:
        self.seconds, self.max_duration = seconds, max_duration
        self.used: dict[str, float] = {}
        self.lock = threading.Lock()

    def schedule(self, visitor: str, duration: float) -> None:
        import gradio as gr

        with self.lock:
            left = self.seconds - self.used.get(visitor, 0.0)
        if duration > self.max_duration:
            raise gr.Error(f"The requested GPU duration ({duration:.0f}s) is larger than the "
                           "maximum allowed", title="ZeroGPU illegal duration", print_exception=False)
        if duration > left:
            raise gr.Error(f"You have exceeded your GPU quota ({duration:.0f}s requested vs. "
                           f"{max(0.0, left):.0f}s left). Try again later.",
                           title="ZeroGPU quota exceeded", print_exception=False)

    def charge(self, visitor: str, seconds: float) -> float:
        with self.lock:
            self.used[visitor] = self.used.get(visitor, 0.0) + seconds
            return self.seconds - self.used[visitor]


QUOTA = Quota(float(os.environ.get("SPACES_SIM_QUOTA_SECONDS", "120")),
              float(os.environ.get("SPACES_SIM_MAX_DURATION", "120")))


def _visitor() -> str:
    """The calling visitor's address, from Gradio's request context (ZeroGPU reads its headers)."""
    try:
        from gradio.context import LocalContext

        request = LocalContext.request.get(None)
        return str(request.client.host) if request is not None and request.client else "anonymous"
    except Exception:  # noqa: BLE001 (no Gradio request: a call from a script)
        return "anonymous"


# ---- a GPU call: fork, pickle, map, refuse ---------------------------------------------------

def GPU(task: Callable | None = None, *, duration: Any = None, size: str | None = None,
        **_: Any) -> Any:
    """`@spaces.GPU`, `@spaces.GPU(duration=...)`: a no-op unless SPACES_ZERO_GPU is true."""
    if task is None:
        return lambda fn: GPU(fn, duration=duration, size=size)
    if not ZERO_GPU:
        return task

    @functools.wraps(task)
    def gradio_handler(*args: Any, **kwargs: Any) -> Any:
        seconds = duration(*args, **kwargs) if callable(duration) else duration
        seconds = 60.0 if seconds is None else float(seconds)  # ZeroGPU's default schedule
        visitor = _visitor()
        try:
            QUOTA.schedule(visitor, seconds)
        except Exception as err:
            record({"event": "refused", "fn": task.__name__, "requested": seconds,
                    "message": str(err)})
            raise
        payload = pickle.dumps((args, kwargs))  # a PicklingError reaches the caller, as there
        started = time.monotonic()
        try:
            outcome, value = _run_forked(task, payload, seconds)
        finally:
            used = time.monotonic() - started
            left = QUOTA.charge(visitor, used)
        record({"event": "call", "fn": task.__name__, "requested": seconds, "used": used,
                "left": left, "outcome": outcome})
        return _result(outcome, value)

    gradio_handler.zerogpu = None
    return gradio_handler


def _result(outcome: str, value: Any) -> Any:
    """The call's value, or the error a visitor sees (zero/wrappers.py: gradio_handler)."""
    import gradio as gr

    if outcome == "ok":
        return value
    if outcome == "aborted":
        raise gr.Error("GPU task aborted", title="ZeroGPU worker error", print_exception=False)
    error_cls, tb, gradio_error = value
    if gradio_error is not None:
        raise gradio_error
    print(tb, file=sys.stderr)
    raise gr.Error(error_cls, title="ZeroGPU worker error", print_exception=False)


def _run_forked(task: Callable, payload: bytes, seconds: float) -> tuple[str, Any]:
    """Run `task` on the pickled arguments in a forked child; its pickled result, or
    ("aborted", None) when it outlives `seconds` (plus a little grace) and is killed."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: nothing here returns
        os.close(read_end)
        _child(task, payload, write_end)
    os.close(write_end)
    deadline = time.monotonic() + seconds + float(os.environ.get("SPACES_SIM_GRACE_SECONDS", "2"))
    data = bytearray()
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_end], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                return "aborted", None
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    if not data:
        return "aborted", None  # the child died without a word (ZeroGPU: "GPU task aborted")
    return pickle.loads(bytes(data))


def _child(task: Callable, payload: bytes, write_end: int) -> None:
    """In the forked worker: unpatch torch, run the task, send back its pickled result or its
    exception as ZeroGPU's worker does (zero/wrappers.py: thread_wrapper, exception_result)."""
    code = 0
    try:
        if os.environ.get("SPACES_SIM_TRACE_AFTER"):  # where a slow child is, for debugging
            import faulthandler

            faulthandler.dump_traceback_later(float(os.environ["SPACES_SIM_TRACE_AFTER"]))
        import torch

        _unpatch(torch)
        args, kwargs = pickle.loads(payload)
        try:
            message = pickle.dumps(("ok", task(*args, **kwargs)))
        except Exception as err:  # noqa: BLE001 (every exception goes back to the caller)
            message = _exception(err)
        with os.fdopen(write_end, "wb") as out:
            out.write(message)
    except BaseException:  # noqa: BLE001 (the worker must end here, whatever happened)
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _exception(err: BaseException) -> bytes:
    import gradio as gr

    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    gradio_error = err if isinstance(err, gr.Error) else None
    try:
        return pickle.dumps(("error", (type(err).__name__, tb, gradio_error)))
    except Exception:  # noqa: BLE001 (an error that does not pickle: named by its class)
        return pickle.dumps(("error", (type(err).__name__, tb, None)))


if ZERO_GPU:
    _start()
