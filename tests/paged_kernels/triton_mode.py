"""How the Triton kernels run in this test process: the kernels folder's one preamble.

Triton decides between compiling and interpreting when a function is *defined*, including its
own library functions (tl.cdiv, tl.sum...) at `import triton`. So without CUDA the interpreter
(`TRITON_INTERPRET=1`) must be switched on before triton is first imported: this module does it
when it is imported, and tests/paged_kernels/conftest.py imports it, which pytest does before it
imports any module of this folder. If another folder's tests imported triton first,
uninterpreted, the Triton tests run in a fresh subprocess instead: test_fresh_process.py runs
those of every kernel module in one process; each module's own fallback test does it for its
module when that test is not in the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
TRITON_IMPORTED_BEFORE = "triton" in sys.modules
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from paged_kernels import interpreter_enabled, triton_available  # noqa: E402


def triton_runs_here(imported_before: bool) -> bool:
    """Whether Triton kernels run in this test process: on CUDA, or under the interpreter when
    it was switched on before triton was first imported (`imported_before`: triton was already
    in sys.modules when the preamble ran; then only a check of how triton defined its own
    functions tells)."""
    if not triton_available():
        return False
    if torch.cuda.is_available():
        return True
    if not interpreter_enabled():
        return False
    if not imported_before:
        return True
    import triton.language as tl

    return type(tl.cdiv).__name__ == "InterpretedFunction"


TRITON_HERE = triton_runs_here(TRITON_IMPORTED_BEFORE)
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
needs_triton = pytest.mark.skipif(
    not TRITON_HERE, reason="needs triton, and CUDA or the interpreter enabled before import"
)
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

#: the fallback test of a kernel test module runs only where triton came in uninterpreted first
fallback_only = pytest.mark.skipif(TRITON_HERE or not triton_available() or HAS_CUDA,
                                   reason="the Triton tests run in this process")


#: the test that runs the Triton tests of the whole folder in one fresh process
ONE_PROCESS_TEST_FILE = Path(__file__).resolve().parent / "test_fresh_process.py"


def rerun_triton_tests_in_a_fresh_process(test_file: str, request: pytest.FixtureRequest) -> None:
    """The module's Triton tests again, in a process that switches the interpreter on before
    triton is first imported; skipped where the session holds test_fresh_process.py, which runs
    them with the other modules' (one process start, not one per module)."""
    if any(item.path.resolve() == ONE_PROCESS_TEST_FILE for item in request.session.items):
        pytest.skip("test_fresh_process.py runs them, with the folder's other Triton tests")
    run_triton_tests_in_a_fresh_process([test_file])


def run_triton_tests_in_a_fresh_process(test_files: list[str]) -> None:
    """The Triton tests of these modules, in one process that switches the interpreter on
    before triton is first imported. Without hypothesis' plugin: no kernel test uses it, and
    its import costs that process a second and a half."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *test_files, "-q", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest", "-k", "triton and not subprocess"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
