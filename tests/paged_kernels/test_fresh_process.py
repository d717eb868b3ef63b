"""The Triton tests of every kernel module of this folder in ONE fresh process, for a session
where another folder's tests imported triton first, uninterpreted (triton_mode.py says why they
cannot run in it). A process start (torch, pytest and triton imported, the first calls' lazy
imports) costs several seconds on a busy 2-core machine: paid once here, not once per module.
While this test is in the session the modules' own fallback tests skip; without it (a run of
some modules only) each of them starts its own process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paged_kernels.triton_mode import fallback_only, run_triton_tests_in_a_fresh_process

HERE = Path(__file__).resolve()


@fallback_only
@pytest.mark.slow
def test_kernel_modules_in_one_fresh_process(request):
    """The Triton tests of the modules of this folder that the session collected."""
    files = sorted({str(path) for path, name in ((i.path.resolve(), i.name) for i in request.session.items)
                    if path.parent == HERE.parent and path != HERE and "triton" in name})
    if not files:
        pytest.skip("the session holds no Triton test of this folder")
    run_triton_tests_in_a_fresh_process(files)
