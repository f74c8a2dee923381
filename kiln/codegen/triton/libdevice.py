"""`libdevice` for generated kernels: CUDA's libdevice on the GPU, numpy under the interpreter.

Triton's `triton.language.extra.libdevice` functions are stubs that only the
GPU compiler resolves; under `TRITON_INTERPRET=1` (how the tests run kernels on
the CPU) they return None. The interpreter runs a kernel as plain Python over
numpy arrays, so there each function is the numpy ufunc applied to the
tensor's data.
"""
from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if interpreting():
    import math
    import types

    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def _np(fn):
        def op(*args):
            tensors = [a for a in args if isinstance(a, tl.tensor)]
            ref = tensors[0]
            data = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
            with np.errstate(all="ignore"):
                out = np.asarray(fn(*data)).astype(ref.handle.data.dtype)
            elem = ref.dtype
            ty = tl.block_type(elem, list(out.shape)) if out.ndim else elem
            return tl.tensor(TensorHandle(out, elem), ty)
        op.__name__ = fn.__name__
        return op

    _TABLE = {
        "log10": np.log10, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
        "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh, "sin": np.sin, "tan": np.tan, "asin": np.arcsin,
        "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
        "acosh": np.arccosh, "atanh": np.arctanh, "atan2": np.arctan2, "floor": np.floor, "ceil": np.ceil,
        "nearbyint": np.rint, "trunc": np.trunc, "fmod": np.fmod, "pow": np.power,
        "copysign": np.copysign, "hypot": np.hypot, "nextafter": np.nextafter, "exp": np.exp,
        "div_rn": np.divide,
    }

    def _erf(x):
        return np.vectorize(math.erf, otypes=[x.dtype])(x)

    def _erfc(x):
        return np.vectorize(math.erfc, otypes=[x.dtype])(x)

    def _lgamma_scalar(v):
        try:
            return math.lgamma(v)
        except ValueError:  # a pole (0, -1, ...): eager gives inf
            return math.inf

    def _lgamma(x):
        return np.vectorize(_lgamma_scalar, otypes=[x.dtype])(x)

    _TABLE["erf"], _TABLE["erfc"], _TABLE["lgamma"] = _erf, _erfc, _lgamma
    libdevice = types.SimpleNamespace(**{name: _np(fn) for name, fn in _TABLE.items()})

    _builtin_range = range

    def interpreter_range(*args):
        """`range` over scalar kernel arguments: the interpreter holds them as 1-element arrays, which
        numpy >= 2.4 no longer converts with int() (Triton 3.6's interpreter relies on that)."""
        return _builtin_range(*[int(a.handle.data.reshape(-1)[0]) if isinstance(a, tl.tensor) else a for a in args])

    def interpreter_to_bf16(x):
        """float -> bfloat16 rounded to nearest even (the interpreter's cast drops the low bits instead)."""
        data = np.ascontiguousarray(x.handle.data, dtype=np.float32)
        bits = torch.from_numpy(data).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        # a NaN as c10's scalar conversion gives it (0x7FC0), which eager's CPU kernels mostly store; torch's
        # vectorized cast of the line above gives 0xFFFF (on the GPU the hardware converts, for kiln and eager)
        bits = np.where(np.isnan(data), np.uint16(0x7FC0), bits)
        ty = tl.block_type(tl.bfloat16, list(bits.shape)) if isinstance(x.type, tl.block_type) else tl.bfloat16
        return tl.tensor(TensorHandle(bits, tl.bfloat16), ty)

    OVERRIDES = {"range": interpreter_range, "kiln_to_bf16": interpreter_to_bf16}
else:
    from triton.language.extra import libdevice  # noqa: F401

    OVERRIDES = {}
