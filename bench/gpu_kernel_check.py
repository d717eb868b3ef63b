"""GPU sanity sweep of the Triton kernels: bf16 accuracy over many shapes, then the pytest file.

For a GPU machine (the kernels' tests run on CPU through the interpreter with tiny shapes; this
covers larger ones and every block size 1..128 on the real compiler). Exits non-zero on failure.

    python bench/gpu_kernel_check.py [--skip-pytest]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from paged_kernels import get_kernel_ops, reference  # noqa: E402
from paged_kernels.testing import make_case, rel_error  # noqa: E402


def reference_f64(case: dict) -> torch.Tensor:
    wide = {k: (v.double() if k in ("q", "k_cache", "v_cache") else v) for k, v in case.items()}
    return reference.paged_attention(**wide)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-pytest", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    ops = get_kernel_ops("cuda")
    assert ops.name == "triton", ops.name
    failures = 0
    gen = torch.Generator().manual_seed(0)
    t0 = time.time()
    for block_size in (1, 2, 4, 8, 16, 32, 64, 128):
        for head_dim in (64, 128):
            for kv_heads, group in ((3, 3), (2, 1), (1, 8), (4, 4)):
                # a mixed batch: a long prefill with a cached prefix, a fresh prompt, decodes
                q_lens = [int(torch.randint(30, 300, (1,), generator=gen)), 17, 1, 1, 1]
                seq_lens = [q_lens[0] + 400, 17, 1, 999, 2500]
                case = make_case(block_size, kv_heads, group, head_dim, q_lens, seq_lens,
                                 dtype=torch.bfloat16, seed=block_size + head_dim)
                want = reference_f64(case)
                for num_splits in (None, 1, 3):
                    err = rel_error(ops.paged_attention(**case, num_splits=num_splits), want)
                    bad = not err <= 1e-2
                    failures += bad
                    if bad or (num_splits is None and kv_heads == 3):
                        print(f"{'FAIL' if bad else 'ok  '} bs={block_size:3d} d={head_dim} "
                              f"kv={kv_heads} g={group} splits={num_splits}: rel err {err:.2e}")
                # decode only, few long sequences: the split-K heuristic's territory
                case = make_case(block_size, kv_heads, group, head_dim, [1] * 3,
                                 [4096, 3000, 129], dtype=torch.bfloat16, seed=7)
                err = rel_error(ops.paged_attention(**case), reference_f64(case))
                failures += not err <= 1e-2
                if not err <= 1e-2:
                    print(f"FAIL decode bs={block_size} d={head_dim} g={group}: {err:.2e}")
    print(f"accuracy sweep: {failures} failures in {time.time() - t0:.0f} s")
    if not args.skip_pytest:
        rc = subprocess.call([sys.executable, "-m", "pytest", "tests/paged_kernels/test_kernel_ops.py", "-q"],
                             cwd=ROOT)
        failures += rc != 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
