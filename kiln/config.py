"""kiln's configuration: one object, every field read somewhere.

`kiln.config` holds process-wide settings (like `torch._dynamo.config`). The
per-call `options=` dict of `kiln.compile` is checked against `OPTIONS`, the
table of compile options, and resolved with the options its `mode=` implies
(`MODES`) into one frozen `CompileOptions`, the dataclass built from that table,
which is what travels through the pipeline: each stage is handed only the
fields it reads. `cache_dir()` and `compiler()` are the environment's settings for
what kiln builds with the C++ compiler (generated kernels, the guards' tensor
checks), read by stages that do not import each other.
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any


@dataclass
class Config:
    """Process-wide settings. Change them by attribute: `kiln.config.cache_size_limit = 16`."""

    cache_size_limit: int = 8
    """Compiled entries kept per code object; past it kiln runs the frame eagerly and warns once."""

    debug_dir: str | None = None
    """Where `trace.enabled` writes each stage's artefacts (KILN_DEBUG_DIR overrides; default ./kiln_debug)."""

    compiled_autograd: bool = False
    """Run every backward started inside a kiln-compiled function through compiled autograd (captured at
    run time with its hooks, compiled by kiln's default backend); see `kiln.compiled_autograd`."""

    progress_delay: float = 1.0
    """Seconds a graph's compile runs before its progress bar appears (bars show on a terminal only)."""

    optimize_ddp: bool = True
    """Split a graph captured inside a DistributedDataParallel forward at DDP's gradient buckets, so that each
    bucket's all-reduce overlaps the backward of earlier layers (torch._dynamo.config.optimize_ddp)."""

    graph_cache: bool = field(default_factory=lambda: os.environ.get("KILN_GRAPH_CACHE", "1") not in ("", "0"))
    """Keep each compiled graph's generated code in the cache directory and reuse it in later compiles of the same
    graph, skipping lowering, scheduling and code generation (kiln/runtime/graph_cache.py). KILN_GRAPH_CACHE=0
    sets the default to off."""

    compiler_timeout: float = field(default_factory=lambda: float(os.environ.get("KILN_COMPILER_TIMEOUT", 300)))
    """Seconds one C++ compiler process may run before kiln kills it; the graph then runs through ATen (a
    fallback). KILN_COMPILER_TIMEOUT sets the default."""


config = Config()


def cache_dir() -> Path:
    """Where kiln keeps what it builds, across processes (KILN_CACHE_DIR, else ~/.cache/kiln)."""
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def debug_dir() -> Path:
    """Where the debug directory is written: `config.debug_dir`, else KILN_DEBUG_DIR, else ./kiln_debug."""
    return Path(config.debug_dir or os.environ.get("KILN_DEBUG_DIR") or "kiln_debug")


def compiler() -> str:
    """The C++ compiler command (KILN_CXX, else CXX, else g++)."""
    return os.environ.get("KILN_CXX") or os.environ.get("CXX") or "g++"




# ----------------------------------------------------------------------------- per-call options


@dataclass(frozen=True)
class Option:
    """One entry of `kiln.compile(options=...)`: its type, default, what it does, and (for a string) the values
    it accepts."""

    type: Any  # a class, or a union such as `str | None`
    default: Any
    doc: str
    choices: tuple = ()

    @property
    def type_name(self) -> str:
        return getattr(self.type, "__name__", str(self.type))

    def check(self, name: str, value: Any) -> None:
        """Raise a TypeError or ValueError naming option `name` if `value` is not one it accepts."""
        if not isinstance(value, self.type):
            raise TypeError(f"kiln.compile: option {name!r} must be {self.type_name}, got {type(value).__name__} "
                            f"({value!r})")
        if self.choices and value is not None and value not in self.choices:
            raise ValueError(f"kiln.compile: option {name!r} must be one of {', '.join(map(repr, self.choices))}, "
                             f"got {value!r}")


OPTIONS: dict[str, Option] = {
    "trace.enabled": Option(bool, False, "write every stage's artefact to the debug directory (kiln.config.debug_dir, "
                            "else KILN_DEBUG_DIR, else ./kiln_debug)"),
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
                            "unpadded; benchmarks/padded_strides.py measures it)"),
    "fallback_random": Option(bool, False, "random ops (rand, randn, dropout, bernoulli, attention's dropout, ...) "
                              "are never decomposed: each runs as the ATen call eager makes, in eager's order, so "
                              "the same seed gives eager's values bit for bit on every device (kiln generates no "
                              "random numbers itself; off, a decomposition such as bernoulli's may draw its "
                              "randomness another way)"),
    "cpu_backend": Option(str | None, None, "the code generator for graphs on CPU tensors: 'cpp' (C++/OpenMP "
                          "kernels) or 'triton' (Triton kernels run by Triton's interpreter, which needs "
                          "TRITON_INTERPRET=1: how the Triton target is tested without a GPU); None: "
                          "KILN_CPU_BACKEND, else 'cpp'. Graphs on CUDA tensors always get Triton",
                          choices=("cpp", "triton")),
}

MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"max_autotune": True, "triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"max_autotune": True},
}


def field_name(option: str) -> str:
    """The CompileOptions field of an option: `trace.enabled` -> `trace_enabled`."""
    return option.replace(".", "_")


def _check_fields(self) -> None:
    """Every value a CompileOptions holds is one its option accepts, however it was built."""
    for f in fields(self):
        OPTIONS[f.metadata["option"]].check(f.metadata["option"], getattr(self, f.name))


def _as_dict(self) -> dict[str, Any]:
    """The options by the names `kiln.compile(options=...)` takes."""
    return {f.metadata["option"]: getattr(self, f.name) for f in fields(self)}


def describe_options(names: list[str] | None = None, with_fields: bool = False) -> str:
    """Each option's name, type, default and description, for `list_options()` and the docstrings; with
    `with_fields`, also the CompileOptions field that holds it."""
    lines = []
    for name in OPTIONS if names is None else names:
        opt = OPTIONS[name]
        held = f" (field {field_name(name)})" if with_fields else ""
        lines.append(f"{name}: {opt.type_name} = {opt.default!r}{held}")
        lines += textwrap.wrap(opt.doc, 100, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


_OPTIONS_DOC = """The options of one compile, resolved from `mode` and `options=`, built from the OPTIONS table. Frozen:
a stage reads the fields it needs and never changes them. Each option is a field, named as the option with
dots as underscores:

"""


CompileOptions = make_dataclass(
    "CompileOptions",
    [(field_name(name), opt.type, field(default=opt.default, metadata={"option": name, "doc": opt.doc}))
     for name, opt in OPTIONS.items()],
    frozen=True,
    namespace={"__post_init__": _check_fields, "as_dict": _as_dict,
               "__doc__": _OPTIONS_DOC + describe_options(with_fields=True)},
)
CompileOptions.__module__ = __name__  # make_dataclass names its caller's module only from Python 3.12


def validate_options(mode: str | None, options: dict | None) -> CompileOptions:
    """Resolve `mode` and `options` into one CompileOptions, or raise an error that names the bad mode or option
    and lists what is accepted."""
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"kiln.compile: mode must be a str or None, got {type(mode).__name__}")
    if mode is not None and mode not in MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}; known modes: {', '.join(MODES)}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict or None, got {type(options).__name__}")
    for name in options or {}:
        if name not in OPTIONS:
            raise ValueError(f"kiln.compile: unknown option {name!r}; known options: {', '.join(sorted(OPTIONS))}")
    resolved = {**MODES[mode or "default"], **(options or {})}
    return CompileOptions(**{field_name(name): value for name, value in resolved.items()})


def as_options(options: CompileOptions | dict | None) -> CompileOptions:
    """`options` as the backend receives them: resolved already, an `options=` dict (validated, no mode) or None
    (every default). Lets kiln's inductor be called directly, as torch.compile calls a backend."""
    return options if isinstance(options, CompileOptions) else validate_options(None, options)


class OptionList(list):
    """The option names, a list as torch._inductor.list_options returns, which prints as a table: each option's
    type, default and description."""

    def __repr__(self) -> str:
        return describe_options(list(self))

    __str__ = __repr__


def list_options() -> OptionList:
    """The names `options=` accepts (torch: torch._inductor.list_options); print it for each option's type,
    default and description."""
    return OptionList(sorted(OPTIONS))


def list_mode_options(mode: str | None = None) -> dict:
    """What each mode sets (torch: torch._inductor.list_mode_options)."""
    if mode is None:
        return {m: dict(v) for m, v in MODES.items()}
    return dict(MODES[mode])
