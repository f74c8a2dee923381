"""Where the Triton tests run their kernels, decided before kiln loads any: import this first.

`KILN_TRITON_TEST_DEVICE=cuda` runs them on the GPU for real. Otherwise they run on CPU
tensors through Triton's interpreter, which `TRITON_INTERPRET=1` selects when a kernel is
decorated (`@triton.jit`, when kiln loads a kernel module). The variable is set here on
machines without a GPU only: it holds for the whole process, and on a GPU machine the CUDA
tests collected alongside would interpret their kernels too (and fail inside CUDA graphs).
"""
import os

import pytest
import torch

DEVICE = os.environ.get("KILN_TRITON_TEST_DEVICE", "cpu")
if DEVICE == "cpu" and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def skip_unless_kernels_run(allow_module_level: bool = False) -> None:
    """Skip the calling test (the module, at module level) where its Triton kernels cannot run."""
    pytest.importorskip("triton")
    if DEVICE == "cpu" and not INTERPRETING:
        pytest.skip("Triton kernels run on CPU tensors only under TRITON_INTERPRET=1",
                    allow_module_level=allow_module_level)
    if DEVICE != "cpu" and not torch.cuda.is_available():
        pytest.skip(f"KILN_TRITON_TEST_DEVICE={DEVICE} but no CUDA device", allow_module_level=allow_module_level)


def skip_module_unless_kernels_run() -> None:
    """Skip the calling test module where its kernels cannot run (call it at module level)."""
    skip_unless_kernels_run(allow_module_level=True)
