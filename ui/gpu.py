"""Running engine work on a Hugging Face ZeroGPU Space, and nowhere else different.

On ZeroGPU a function decorated with `spaces.GPU` runs in a forked worker that holds the GPU for
the call only; its arguments and results are pickled. Sessions pickle as config + op log
(ui/session.py), so the worker replays the session's log, runs the operation, and returns the
new log and figures: nothing on the GPU has to survive between calls. Elsewhere this is a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

ON_ZEROGPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")


def gpu_task(fn: F) -> F:
    if not ON_ZEROGPU:
        return fn
    import spaces  # present on Spaces only

    return spaces.GPU(fn)
