"""kiln's configuration: one object, every field read somewhere.

`kiln.config` holds process-wide settings (like `torch._dynamo.config`); the
per-call `options=` dict of `kiln.compile` is validated against `OPTIONS`, the
table of code-generator options, and `MODES` maps each `mode=` to the options
it implies. `cache_dir()` and `compiler()` are the environment's settings for
what kiln builds with the C++ compiler (generated kernels, the guards' tensor
checks), read by stages that do not import each other.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Config:
    """Process-wide settings. Change them by attribute: `kiln.config.cache_size_limit = 16`."""

    cache_size_limit: int = 8
    """Compiled entries kept per code object; past it kiln runs the frame eagerly and warns once."""

    debug_dir: str | None = None
    """Where `trace.enabled` writes each stage's artefacts (KILN_DEBUG_DIR overrides; default ./kiln_debug)."""

    progress_delay: float = 1.0
    """Seconds a graph's compile runs before its progress bar appears (bars show on a terminal only)."""


config = Config()


def cache_dir() -> Path:
    """Where kiln keeps what it builds, across processes (KILN_CACHE_DIR, else ~/.cache/kiln)."""
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def compiler() -> str:
    """The C++ compiler command (KILN_CXX, else CXX, else g++)."""
    return os.environ.get("KILN_CXX") or os.environ.get("CXX") or "g++"


@dataclass(frozen=True)
class Option:
    """One entry of `kiln.compile(options=...)`: its type, default and what it does."""

    type: type
    default: Any
    doc: str


OPTIONS: dict[str, Option] = {
    "trace.enabled": Option(bool, False, "write every stage's artefact to the debug directory"),
    "trace.graph_diagram": Option(bool, False, "draw the captured and the fused graph as SVG in the debug directory"),
    "check_accuracy": Option(bool, False, "run each compiled graph against eager too; report the first diverging node"),
    "triton.cudagraphs": Option(bool, False, "record CUDA graphs (kiln/runtime/cudagraphs.py) and replay them: "
                                "less launch overhead; outputs valid until the next call"),
    "max_autotune": Option(bool, False, "Triton: benchmark block sizes, num_warps and num_stages of each kernel on "
                           "its first call's inputs and keep the fastest (kiln/runtime/autotune.py, decisions cached "
                           "on disk); matmuls (mm, addmm, bmm) also try a Triton template against ATen"),
    "epilogue_fusion": Option(bool, True, "fuse the pointwise ops that follow a matmul (bias, activation) into its "
                              "Triton template (every matmul under max_autotune, small ones otherwise) instead of a "
                              "kernel of their own"),
    "shape_padding": Option(bool, True, "CUDA: pad the inner dims of matmul operands to a multiple of 8 (fp16/bf16) "
                            "or 4 (fp32 with TF32) for tensor cores, slicing the result back (on by default, as in "
                            "torch: a matmul over an odd dimension, such as a vocabulary size, runs much slower "
                            "unpadded)"),
}

MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


def validate_options(mode: str | None, options: dict | None) -> dict[str, Any]:
    """Resolve `mode` and `options` into one dict of option values, or raise a clear error."""
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"kiln.compile: mode must be a str or None, got {type(mode).__name__}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}; known modes: {', '.join(MODES)}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict or None, got {type(options).__name__}")
    resolved = {name: opt.default for name, opt in OPTIONS.items()}
    resolved.update(MODES[mode or "default"])
    for name, value in (options or {}).items():
        if name not in OPTIONS:
            raise ValueError(f"kiln.compile: unknown option {name!r}; known options: {', '.join(sorted(OPTIONS))}")
        expected = OPTIONS[name].type
        if not isinstance(value, expected):
            raise TypeError(f"kiln.compile: option {name!r} must be {expected.__name__}, got {type(value).__name__}")
        resolved[name] = value
    return resolved


def list_options() -> list[str]:
    """The names `options=` accepts (torch: torch._inductor.list_options)."""
    return sorted(OPTIONS)


def list_mode_options(mode: str | None = None) -> dict:
    """What each mode sets (torch: torch._inductor.list_mode_options)."""
    if mode is None:
        return {m: dict(v) for m, v in MODES.items()}
    return dict(MODES[mode])

