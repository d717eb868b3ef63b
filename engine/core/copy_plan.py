"""A step's block copies, in the order the bookkeeping made them, as waves of independent copies.

The bookkeeping moves a block's tokens at once; the device moves its bytes later, before the
forward pass. Within one schedule a block may be read by one copy and then, freed and handed out
again, written by another: a swap-in frees the CPU blocks it reads, and a swap-out preempting
another request in the same step may take exactly those; a group may be swapped in and out again
in one step. Any fixed order of the kinds of copy (swap-outs first, say) gets one of these wrong.
What is always right is the order in which the bookkeeping made the copies, which it records as
data while it makes them (engine/core/block_writer.py: `BlockCopy`, one per block): each copy
reads its source as it stood at that moment.

`copy_waves` keeps that order and still batches: it cuts the copies into waves, starting a new
wave only where a copy touches a block that an earlier copy of the current wave wrote, or writes
one that it read. Copies within a wave are independent, so the runtime may run each kind of copy
of a wave as one launch. A step without such a dependency is one wave, as before.

One dependency stays inside a wave: a load into a GPU block that an offload of the wave read (a
long prompt's blocks taken by evicting cached ones to the tier, then filled from it). A wave
runs its kinds in COPY_KINDS order, offloads before loads, and every runtime reads an offload's
blocks before a later load writes them (engine/runtime/tier_copies.py: the load's scatter waits
for the compute stream's gathers), so the prompt's offloads and loads go in one launch each.

Locations are (space, block id): the GPU pool, the CPU swap space, the CPU tier of the prefix cache.
"""

from __future__ import annotations

from typing import NamedTuple

#: The runtime's copy methods (engine/runtime/protocols.py), in the order a wave runs them. Within a
#: wave no copy depends on another, so any order would do; this one is stable for readers of logs.
COPY_KINDS = ("offload", "swap_out", "swap_in", "load", "copy_blocks")

# (source space, destination space) of each kind
_SPACES = {"offload": ("gpu", "tier"), "swap_out": ("gpu", "cpu"), "swap_in": ("cpu", "gpu"),
           "load": ("tier", "gpu"), "copy_blocks": ("gpu", "gpu")}
# the same as numbers: a location is block * 3 + space (a step of a long prefix's loads and the
# evictions they cause makes hundreds of copies: ints hash faster than (space, block) tuples)
_CODES = {kind: tuple(("gpu", "cpu", "tier").index(space) for space in spaces)
          for kind, spaces in _SPACES.items()}


class BlockCopy(NamedTuple):
    """One block's bytes to move: `kind` names the runtime's copy method (COPY_KINDS)."""

    kind: str
    src: int  # the source block (a GPU block, a CPU swap block or a tier slot, by kind)
    dst: int  # the destination block, likewise


Wave = dict[str, list[tuple[int, int]]]  # kind -> (source, destination) pairs


def copy_waves(copies: list[BlockCopy]) -> list[Wave]:
    """The copies, in the order they were made, cut into waves: run the waves in order, the
    copies of a wave in any order (each kind as one batch). Empty when there are none."""
    waves: list[Wave] = []
    wave: Wave = {}
    read: set[int] = set()
    gathered: set[int] = set()  # the GPU blocks the wave's offloads read: loads may write them
    written: set[int] = set()
    for kind, src, dst in copies:
        src_space, dst_space = _CODES[kind]
        source, target = 3 * src + src_space, 3 * dst + dst_space
        if source in written or target in read or target in written or (
                kind != "load" and target in gathered):
            waves.append(wave)  # this copy must see the wave's writes, or come after its reads
            wave, read, gathered, written = {}, set(), set(), set()
        wave.setdefault(kind, []).append((src, dst))
        (gathered if kind == "offload" else read).add(source)
        written.add(target)
    if wave:
        waves.append(wave)
    return waves


def run_wave(wave: Wave, target: object) -> None:
    """Hand one wave's copies to a runtime (or anything with its copy methods), kind by kind."""
    for kind in COPY_KINDS:
        pairs = wave.get(kind)
        if pairs:
            getattr(target, kind)(pairs)
