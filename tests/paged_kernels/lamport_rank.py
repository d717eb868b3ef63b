"""One rank of tests/paged_kernels/test_lamport.py's two-process run: `python -m
tests.paged_kernels.lamport_rank RANK FOLDER`. Both ranks map both buffers (files in FOLDER), make the
same calls of the fused all-reduce under Triton's interpreter and save what each call gave."""

from __future__ import annotations

import sys
import time

import torch

WORLD, ROWS, HIDDEN = 2, 4, 24  # 24 of a 32-wide block: the mask is exercised
ROW_COUNTS = [3, 1, 4, 2, 4, 4, 1, 3]  # the slots come round again with fewer rows than before
EPS = 1e-5


def inputs(call: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank `rank`'s partial sums, the residual and the norm's weight of call `call`; some
    partial sums are -0.0, the empty mark, which must still count as zero."""
    t = ROW_COUNTS[call]
    x = torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(100 * call + rank))
    x[:, ::5] = -0.0
    res = torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(100 * call + 50))
    weight = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(7))
    return x, res, weight


def main(rank: int, folder: str) -> None:
    from paged_kernels.lamport import STATE_INTS, buffer_elements, reduce_add_rms_norm

    n = buffer_elements(WORLD, ROWS, HIDDEN)
    buffers = [torch.from_file(f"{folder}/buffer{q}", shared=True, size=n, dtype=torch.float32)
               for q in range(WORLD)]
    peers = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    state = torch.zeros(STATE_INTS, dtype=torch.int32)
    got = []
    for call in range(len(ROW_COUNTS)):
        x, res, weight = inputs(call, rank)
        if rank == 1:
            time.sleep(0.2)  # rank 0 reads first: a slot left unemptied would be read stale
        got.append(reduce_add_rms_norm(x, res, weight, EPS, peers, state, rank, WORLD, ROWS))
    torch.save({"outputs": got, "state": state}, f"{folder}/rank{rank}.pt")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
