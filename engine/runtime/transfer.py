"""Small host arrays onto the device without waiting for the stream."""

from __future__ import annotations

import numpy as np
import torch


def to_device(values: list | np.ndarray, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """A small host list or array on the device without a sync: from pinned memory on a GPU (a
    copy from pageable memory may wait for the stream, i.e. for the whole forward pass)."""
    t = torch.as_tensor(values, dtype=dtype)
    if dev.type == "cuda":
        t = t.pin_memory()
    return t.to(dev, non_blocking=True)

