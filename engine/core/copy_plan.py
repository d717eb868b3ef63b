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

from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

#: The runtime's copy methods (engine/runtime/protocols.py), in the order a wave runs them. Within a
#: wave no copy depends on another, so any order would do; this one is stable for readers of logs.
COPY_KINDS = ("offload", "swap_out", "swap_in", "load", "copy_blocks")

# (source space, destination space) of each kind
_SPACES = {"offload": ("gpu", "tier"), "swap_out": ("gpu", "cpu"), "swap_in": ("cpu", "gpu"),
           "load": ("tier", "gpu"), "copy_blocks": ("gpu", "gpu")}
# the same as indexes into a wave's sets of blocks by space (a step of a long prefix's loads
# and the evictions they cause makes hundreds of copies: one set of ints a space, no pairs)
_CODES = {kind: tuple(("gpu", "cpu", "tier").index(space) for space in spaces)
          for kind, spaces in _SPACES.items()}


_KIND = itemgetter(0)


class BlockCopy(NamedTuple):
    """One block's bytes to move: `kind` names the runtime's copy method (COPY_KINDS)."""

    kind: str
    src: int  # the source block (a GPU block, a CPU swap block or a tier slot, by kind)
    dst: int  # the destination block, likewise


Wave = dict[str, list[tuple[int, int]]]  # kind -> (source, destination) pairs


def copy_waves(copies: list[BlockCopy]) -> list[Wave]:
    """The copies, in the order they were made, cut into waves: run the waves in order, the
    copies of a wave in any order (each kind as one batch). Empty when there are none.

    A run of copies of one kind between two spaces (a prompt's hundreds of offloads, then its
    loads) joins the wave whole when none of it collides with the wave or with itself, checked
    by set operations; otherwise, and for copies within the GPU pool, a copy at a time."""
    waves: list[Wave] = []
    wave: Wave = {}
    # by space (gpu, cpu, tier): the blocks the wave reads and writes; `gathered`, the GPU
    # blocks its offloads read, which its loads may write
    read: tuple[set[int], ...] = (set(), set(), set())
    gathered: set[int] = set()
    written: tuple[set[int], ...] = (set(), set(), set())
    for kind, run in groupby(copies, key=_KIND):
        src_space, dst_space = _CODES[kind]
        _, sources, targets = zip(*run, strict=True)
        ts = set(targets)
        reads = gathered if kind == "offload" else read[src_space]
        if src_space != dst_space and len(ts) == len(targets) \
                and written[src_space].isdisjoint(sources) and read[dst_space].isdisjoint(ts) \
                and written[dst_space].isdisjoint(ts) \
                and (kind == "load" or dst_space or gathered.isdisjoint(ts)):
            # no copy of the run reads another's target (two spaces), nor collides with the wave
            wave.setdefault(kind, []).extend(zip(sources, targets, strict=True))
            reads.update(sources)
            written[dst_space].update(ts)
            continue
        for src, dst in zip(sources, targets, strict=True):
            if src in written[src_space] or dst in read[dst_space] or dst in written[dst_space] \
                    or (kind != "load" and dst_space == 0 and dst in gathered):
                waves.append(wave)  # this copy must see the wave's writes, or come after its reads
                wave, gathered = {}, set()
                read, written = (set(), set(), set()), (set(), set(), set())
                reads = gathered if kind == "offload" else read[src_space]
            wave.setdefault(kind, []).append((src, dst))
            reads.add(src)
            written[dst_space].add(dst)
    if wave:
        waves.append(wave)
    return waves


def run_wave(wave: Wave, target: object) -> None:
    """Hand one wave's copies to a runtime (or anything with its copy methods), kind by kind."""
    for kind in COPY_KINDS:
        pairs = wave.get(kind)
        if pairs:
            getattr(target, kind)(pairs)
