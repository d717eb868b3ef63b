"""Run by tests/space/test_stand_in.py in a process of its own (the stand-in `spaces` patches
torch for the whole process): pokes at the stand-in's contract and prints what it saw as JSON.

    SPACES_ZERO_GPU=true PYTHONPATH=tests/space_sim python tests/space/stand_in_probe.py [bad-fork]
"""

from __future__ import annotations

import json
import os
import sys
import time


def bad_fork() -> dict:
    """CUDA initialised before `spaces`: its import must refuse, with ZeroGPU's words."""
    import torch

    torch.cuda.is_initialized = lambda: True  # what a real CUDA init before the import leaves
    try:
        import spaces  # noqa: F401
    except RuntimeError as err:
        return {"import_error": str(err)}
    return {"import_error": None}


def caught(fn, *args) -> dict:
    """What a call did: its value, or the error's class, title and message."""
    try:
        return {"value": fn(*args)}
    except Exception as err:  # noqa: BLE001 (the probe reports every kind)
        return {"error": type(err).__name__, "title": getattr(err, "title", None),
                "message": str(getattr(err, "message", err))}


def main() -> dict:
    import spaces  # first, as app.py does
    import torch
    from gradio import Error

    out: dict = {"parent_pid": os.getpid(), "main_is_available": torch.cuda.is_available()}
    out["main_cuda_tensor"] = caught(lambda: torch.zeros(1, device="cuda").sum().item())

    @spaces.GPU(duration=1)
    def where(x):
        return os.getpid(), torch.cuda.is_available(), x * 2

    @spaces.GPU(duration=lambda seconds: seconds)  # a dynamic duration, as ui/gpu_jobs.py asks
    def sleeps(seconds):
        time.sleep(60)  # outlives any duration asked
        return "woke"

    @spaces.GPU(duration=2)
    def raises(kind):
        if kind == "gradio":
            raise Error("the prompt is 1,500 tokens; the most is 1,024")
        if kind == "value":
            raise ValueError("this sentence is lost on ZeroGPU")
        return lambda: None  # a result that does not pickle

    out["call"] = caught(where, 21)
    out["unpicklable_argument"] = caught(where, lambda: None)
    out["gradio_error"] = caught(raises, "gradio")
    out["value_error"] = caught(raises, "value")
    out["unpicklable_result"] = caught(raises, "result")
    started = time.monotonic()
    out["overrun"] = {**caught(sleeps, 1), "seconds": time.monotonic() - started}
    out["over_max"] = caught(sleeps, 9)  # SPACES_SIM_MAX_DURATION=8
    out["over_quota"] = caught(sleeps, 4)  # SPACES_SIM_QUOTA_SECONDS=5, about 2 s used by now
    with open(os.environ["SPACES_SIM_LOG"]) as f:
        out["log"] = [json.loads(line) for line in f]
    return out


if __name__ == "__main__":
    result = bad_fork() if sys.argv[1:] == ["bad-fork"] else main()
    print("PROBE " + json.dumps(result, default=repr), flush=True)
