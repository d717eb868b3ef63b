"""The device's copy bandwidth (bytes read + written per second), the floor every roofline in
the engine benchmarks divides by; measured in the same run as what it is set against."""

from __future__ import annotations

import time

import torch


def copy_bandwidth(device: str) -> float:
    """An eager copy of 1 GiB (16 MiB on a CPU), 10 times after 3 warm-ups."""
    x = torch.empty(1 << 30 if device == "cuda" else 1 << 24, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)
