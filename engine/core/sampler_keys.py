"""What a sampled token is drawn from, torch-free: a row of the step's scores, the request's
sampling parameters, and one uniform number from a counter-based hash.

The hash of (request seed, sample index within the request, output position) replaces a
per-request RNG: a seeded request draws the same tokens whatever else is in the batch, whatever
row it lands in, and after a preemption, and no RNG state lives between steps. The dry mode and
the model path (sampler.py) both draw from it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from engine.core.sequence import SamplingParams

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective scramble of 64 bits (cheap in plain Python)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def request_key(seed: int) -> int:
    """A request's seed scrambled once; `sample_uniform` counts from it."""
    return _mix64((seed + 0x9E3779B97F4A7C15) & _MASK64)


def sample_uniform(key: int, sample_index: int, position: int) -> float:
    """A uniform number in [0, 1) fixed by (request key, which sample of the request, which
    output token): the counter that replaces a per-request RNG. As splitmix64 does with one
    counter, the two counters step the key by large odd constants before one scramble."""
    x = _mix64((key + sample_index * 0xD1B54A32D192ED03 + position * 0x8CB92BA72F3D8DD7) & _MASK64)
    return (x >> 11) * (1.0 / (1 << 53))


class SampleRequest(NamedTuple):
    """One token to draw: from logits row `row`, under `params`, at uniform `u` (a NamedTuple:
    one is made per sampled sequence per step)."""

    row: int
    params: SamplingParams
    u: float


def sample_uniforms(counters: list[tuple[int, int, int]]) -> Any:
    """`sample_uniform` of many (key, sample index, position) at once, as a numpy float64
    array: numpy's uint64 arithmetic wraps at 2**64 as the masks above do, so the values are
    the same bits (one step's sampled rows hashed in one pass, not a Python call each)."""
    import numpy as np

    c = np.array(counters, dtype=np.uint64).reshape(-1, 3)
    x = mix64_array(c[:, 0] + c[:, 1] * np.uint64(0xD1B54A32D192ED03)
                    + c[:, 2] * np.uint64(0x8CB92BA72F3D8DD7))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def mix64_array(x: Any) -> Any:
    """`_mix64` of a numpy uint64 array, element by element (the same bits)."""
    import numpy as np

    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = (x ^ (x >> np.uint64(shift))) * np.uint64(mult)
    return x ^ (x >> np.uint64(31))
