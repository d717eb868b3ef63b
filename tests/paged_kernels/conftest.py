"""The kernels folder's preamble: pytest imports this file before the folder's test modules, so
importing triton_mode here switches Triton's interpreter on (without CUDA) before any kernel
test imports triton. Written once here instead of at the top of every kernel test module."""

import tests.paged_kernels.triton_mode  # noqa: F401  (the preamble runs on import)
