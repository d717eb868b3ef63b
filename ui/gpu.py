"""Where a Space's work runs: ZeroGPU's rules here, and nothing different anywhere else.

On a ZeroGPU Space (SPACES_ZERO_GPU=true) app.py imports the `spaces` package before anything
touches torch: it patches torch so that the main process *emulates* CUDA (is_available() says
True, tensors "on cuda" stay in host memory) and raises if anything really initialises CUDA. A
GPU exists only inside a function decorated with `spaces.GPU`: it runs in a forked worker, gets
its arguments and returns its result pickled, may run for its `duration` at most, and that
duration must fit in what is left of the visitor's daily GPU quota (2 minutes unsigned).

So on ZeroGPU every engine of the main process (sessions, lessons, rooms, the inspector) runs on
the CPU (`main_device`), and only serving work too long for the CPU goes to the GPU, through the
one GPU function of ui/gpu_jobs.py (ARCHITECTURE.md, "On a Hugging Face Space", says why).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

#: as the `spaces` package reads it
ON_ZEROGPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
#: the GPU calls' dtype: the CPU engines' own, so a session replayed on either device chooses the
#: same tokens (bf16 would halve the KV bytes and part from the CPU's text within a few tokens)
GPU_DTYPE = "float32"


def main_device(asked: str) -> str:
    """The device of the main process's engines: the CPU on ZeroGPU (its CUDA is emulated, and a
    real initialisation raises), else what was asked."""
    return "cpu" if ON_ZEROGPU else asked


def gpu_function(fn: Callable, duration: Callable[..., float]) -> Callable:
    """`fn` as a ZeroGPU GPU function asking for `duration(*args)` seconds; elsewhere `fn`
    itself. Decorate at import: ZeroGPU registers its GPU functions when the app launches."""
    if not ON_ZEROGPU:
        return fn
    import spaces  # present on a ZeroGPU Space (requirements.txt), imported first by app.py

    return spaces.GPU(duration=duration)(fn)


def place_gpu_model(name: str = "default") -> str:
    """Put the GPU calls' model on `cuda` before the app launches, as ZeroGPU's docs ask: the
    main process only emulates the placement, `spaces` packs the weights when the app launches
    and moves them onto each worker's GPU. Where torch has no CUDA build (a simulated Space) the
    GPU calls run on the CPU's copy. Returns a line for the log."""
    from engine.runtime import models

    if not ON_ZEROGPU:
        return "not on ZeroGPU"
    if not models.cuda_build():
        return "torch has no CUDA build here: the GPU calls run on the CPU's weights"
    try:
        loaded = models.load_model(name, "cuda", GPU_DTYPE)
    except Exception as err:  # the GPU calls then load the weights themselves (slower)
        print(f"[pagedlab] could not place {name} on cuda at start: {err}", file=sys.stderr)
        return f"not placed at start ({type(err).__name__}); each GPU worker loads it"
    return f"{name} placed on {loaded.device} in {GPU_DTYPE} for the GPU calls"


def spaces_error(err: Any) -> bool:
    """Whether a gr.Error came from ZeroGPU itself (no GPU, quota spent, task aborted) rather
    than from the GPU function: ZeroGPU titles its own errors 'ZeroGPU ...'."""
    return str(getattr(err, "title", "")).startswith("ZeroGPU")
