"""Compile Triton kernels of this repository for an H100 (sm_90) on a machine without a GPU:
`python -m tests.paged_kernels.compile_for_hopper` prints the PTX of paged_kernels/lamport.py's kernel in each
dtype it takes, or the compiler's error; `... compile_for_hopper norm_matmul` the same for the
kernels of paged_kernels/norm_matmul.py. Triton's interpreter runs a kernel's Python, not the
compiler: a kernel can pass every interpreted test and still not compile (issue 43's run 3 found
one). Must run without TRITON_INTERPRET."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from paged_kernels.lamport import MAX_SPIN, _lamport_add_rms_norm_kernel
from paged_kernels.norm_matmul import _norm_gate_up_silu_kernel, _norm_linear_kernel

DTYPES = {"bf16": 16, "fp16": 16, "fp32": 32}


def lamport_ptx(dtype: str) -> str:
    """The kernel's PTX for sm_90: rows of 2,048, two ranks, a residual."""
    p = f"*{dtype}"
    sig = {"x_ptr": p, "res_ptr": p, "w_ptr": p, "out_ptr": p, "res_out_ptr": p,
           "peers_ptr": "*i64", "state_ptr": "*i32", "eps": "fp32", "T": "i32"}
    const = {"N": 2048, "BLOCK": 2048, "RANK": 0, "WORLD": 2, "ROWS": 32, "BITS": DTYPES[dtype],
             "HAS_RES": True, "MAX_SPIN": MAX_SPIN}
    return _ptx(_lamport_add_rms_norm_kernel, sig, const)


#: an H100's shared memory a block may use (Triton's OutOfResources limit on sm_90)
HOPPER_SHARED = 232448


def norm_matmul_ptx(dtype: str) -> str:
    """Both kernels' PTX for sm_90 (a residual; the qkv one with a bias), one string, in their
    largest tiles (norm_matmul._grid_shape's, launched three stages deep); a kernel asking for more
    shared memory than an H100 has raises (the GPU raised OutOfResources at launch, run 53)."""
    p = f"*{dtype}"
    sizes = {"rows": "i32", "N": "i32", "K": "i32", "eps": "fp32"}
    const = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "HAS_RES": True, "IEEE": dtype == "fp32"}
    linear = dict.fromkeys(["x_ptr", "res_ptr", "res_out_ptr", "w_norm_ptr", "w_ptr", "b_ptr",
                            "out_ptr"], p) | sizes
    gate_up = dict.fromkeys(["x_ptr", "res_ptr", "res_out_ptr", "w_norm_ptr", "w_ptr", "out_ptr"],
                            p) | sizes
    return (_ptx(_norm_linear_kernel, linear, const | {"HAS_BIAS": True})
            + _ptx(_norm_gate_up_silu_kernel, gate_up, const))


def _ptx(kernel, sig: dict, const: dict, stages: int = 3) -> str:
    names = [*sig, *const]
    src = ASTSource(fn=kernel, signature=sig | dict.fromkeys(const, "constexpr"),
                    constexprs={(names.index(k),): v for k, v in const.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_stages": stages, "num_warps": 4})
    if compiled.metadata.shared > HOPPER_SHARED:
        raise RuntimeError(f"{kernel.__name__} asks {compiled.metadata.shared} bytes of shared "
                           f"memory, an H100 has {HOPPER_SHARED}")
    return compiled.asm["ptx"]


if __name__ == "__main__":
    which = norm_matmul_ptx if sys.argv[1:] == ["norm_matmul"] else lamport_ptx
    for name in DTYPES:
        try:
            ptx = which(name)
        except Exception as err:  # noqa: BLE001 (the test prints what the compiler said)
            print(f"{name}: {type(err).__name__}: {err}")
            sys.exit(1)
        print(f"{name}: {len(ptx)} chars; volatile loads {ptx.count('ld.volatile.global')}; "
              f"atomic adds {ptx.count('atom.global')}; mma {ptx.count('mma.sync') + ptx.count('wgmma')}")
