"""The cyclic garbage collector, settled for serving once a GPU engine is warm.

A long prompt's bookkeeping makes objects the collector tracks by the thousand: the tier's
document repeat (a 4,096-token prompt whose blocks come back from the CPU tier, evicting 244
others) leaves ~1,100 of them alive after its step (the engine's records of it) and frees more
by reference counting within the step. CPython counts them: every 700 net allocations it
pauses for a young collection, every tenth of those walks the middle generation, and every
tenth of those may walk the whole heap, in whichever step allocates next. On a GPU the host's
bookkeeping is the critical path of a long prompt's step (the device waits for it), so those
pauses are the step's. Serving engines move them: vLLM freezes its start-up heap, TRT-LLM and
lmdeploy raise the young generation's threshold so that steps come and go with fewer
collections.

`settle_heap` does both, once a GPU engine has warmed up (a tensor-parallel engine: in its own
process and in each worker's):

- the objects alive then (the model's modules, the pool's blocks, compiled kernels) leave the
  collector's generations (`gc.freeze`): a full collection walked all of them, 0.2 s on the test
  machine, every few steps of a long prompt;
- a young collection waits for `YOUNG_THRESHOLD` net allocations instead of 700 (at most one
  every ~18 such repeats, instead of one or more in each), and the older generations, whose
  thresholds count young collections, come ~30 times less often. On the 2-core CPU the dry
  bookkeeping of the tier's document repeat took 10-20% less host time, a hybrid model's
  prefill 15-35% less (`bench/dry_bookkeeping.py`, `bench/results/dry_collector_ab.json`).

The engine holds no reference cycles, so nothing it drops waits on the collector to be freed;
cycles made elsewhere in the process (an app's) are still collected, later. The frozen objects
go back to the collector at exit, where the last collections run. Process-wide, as the collector
is: set once, by the first warm GPU engine, and left for the process's life.
"""

from __future__ import annotations

import atexit
import gc

#: net allocations of tracked objects between young collections once settled (CPython's: 700)
YOUNG_THRESHOLD = 20_000


def settle_heap() -> None:
    """Freeze what is alive now out of the collector's generations, and make young collections
    rarer (the module's docstring says why)."""
    gc.collect()
    gc.freeze()
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, young), middle, oldest)
    atexit.unregister(gc.unfreeze)  # one exit hook however many engines settle the heap
    atexit.register(gc.unfreeze)
