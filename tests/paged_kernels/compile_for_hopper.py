"""Compile a Triton kernel of this repository for an H100 (sm_90) on a machine without a GPU:
`python -m tests.paged_kernels.compile_for_hopper` prints the PTX of paged_kernels/lamport.py's kernel in each
dtype it takes, or the compiler's error. Triton's interpreter runs a kernel's Python, not the
compiler: a kernel can pass every interpreted test and still not compile (issue 43's run 3 found
one). Must run without TRITON_INTERPRET."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from paged_kernels.lamport import MAX_SPIN, _lamport_add_rms_norm_kernel

DTYPES = {"bf16": 16, "fp16": 16, "fp32": 32}


def lamport_ptx(dtype: str) -> str:
    """The kernel's PTX for sm_90: rows of 2,048, two ranks, a residual."""
    p = f"*{dtype}"
    sig = {"x_ptr": p, "res_ptr": p, "w_ptr": p, "out_ptr": p, "res_out_ptr": p,
           "peers_ptr": "*i64", "state_ptr": "*i32", "eps": "fp32", "T": "i32"}
    const = {"N": 2048, "BLOCK": 2048, "RANK": 0, "WORLD": 2, "ROWS": 32, "BITS": DTYPES[dtype],
             "HAS_RES": True, "MAX_SPIN": MAX_SPIN}
    names = [*sig, *const]
    src = ASTSource(fn=_lamport_add_rms_norm_kernel, signature=sig | dict.fromkeys(const, "constexpr"),
                    constexprs={(names.index(k),): v for k, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


if __name__ == "__main__":
    for name in DTYPES:
        try:
            ptx = lamport_ptx(name)
        except Exception as err:  # noqa: BLE001 (the test prints what the compiler said)
            print(f"{name}: {type(err).__name__}: {err}")
            sys.exit(1)
        print(f"{name}: {len(ptx)} chars; volatile loads {ptx.count('ld.volatile.global')}; "
              f"atomic adds {ptx.count('atom.global')}")
