"""What a step really costs on this machine: the wall time between a runtime's forward passes, by
batch bucket and kind of step, for speculative decoding's choice (engine/core/draft_policy.py).

A verification step costs more than its graph's GPU time says: under async scheduling a plain
decode step overlaps the host's work for the next one, while a step that verifies drafts must
land before the next can be scheduled (its lookups need the kept tokens), so it pays the host's
time and the GPU's one after the other. How much that is depends on the batch, the model and
the host, so it is measured, not modelled: the interval from one forward pass to the next is a
step's cost (the host's scheduling, launching and landing of it, and the wait for the device
where the host had to wait). `ratio(bucket)` is a verification step's median interval over a
plain decode step's, once both were seen a few times in that bucket.

Only where steps replay graphs (a GPU): on a CPU nothing overlaps and the policy's cost stays a
fixed function, so runs there stay reproducible.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

#: a gap longer than this is idle time between runs, not a step's cost
IDLE_S = 0.25
MIN_SAMPLES = 3
KEEP = 16  # the latest intervals of each kind and bucket


class StepClock:
    """Intervals between forward passes, by (kind, bucket); kind "decode" or "verify"."""

    def __init__(self) -> None:
        self._samples: dict[tuple[str, int], deque[float]] = {}
        self._open: tuple[str, int] | None = None
        self._since = 0.0

    def tick(self, kind: str | None, bucket: int, now: float | None = None) -> None:
        """A forward pass starts now: it closes the interval of the one before. `kind` None: a
        step that is neither (a prefill), whose interval is not kept."""
        now = time.perf_counter() if now is None else now
        if self._open is not None and now - self._since < IDLE_S:
            self._samples.setdefault(self._open, deque(maxlen=KEEP)).append(now - self._since)
        self._open = None if kind is None else (kind, bucket)
        self._since = now

    def ratio(self, bucket: int) -> float | None:
        """A verification step's cost over a decode step's in this bucket, or None while either
        was seen fewer than MIN_SAMPLES times."""
        verify = self._samples.get(("verify", bucket))
        decode = self._samples.get(("decode", bucket))
        if not verify or not decode or min(len(verify), len(decode)) < MIN_SAMPLES:
            return None
        return statistics.median(verify) / statistics.median(decode)

    def seen(self) -> dict[str, float]:
        """The median interval (ms) of each kind and bucket seen: for benchmarks' reports."""
        return {f"{kind}@{bucket}": round(1e3 * statistics.median(v), 3)
                for (kind, bucket), v in sorted(self._samples.items()) if v}
