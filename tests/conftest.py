"""Loaded before any test module: decide where Triton kernels run before anything imports triton.

Triton reads TRITON_INTERPRET when its own library functions (`tl.zeros`, ...) are decorated, at its
import. Test modules that use torch.compile as the reference import triton through torch, so the
decision in `triton_device` must be made here, ahead of every module, not in the Triton tests.
"""
import triton_device  # noqa: F401  (sets TRITON_INTERPRET on machines without a GPU)
