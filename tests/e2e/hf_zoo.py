"""The Hugging Face zoo: every architecture of hf_architectures.py through kiln and torch.compile, side by side.

    python -m tests.e2e.hf_zoo --all --out zoo.jsonl               # the full sweep (slow: run it niced, in chunks)
    python -m tests.e2e.hf_zoo --only bert,t5 --modes training      # some architectures or modes
    python -m tests.e2e.hf_zoo --checks capture --all --out z.jsonl # only graph counts and fullgraph
    python -m tests.e2e.hf_zoo --table zoo.jsonl                   # the Markdown table of a sweep

Per architecture and mode (inference: eval() under no_grad; training: train(), forward with labels so that
the model computes its loss, and backward) a case runs:
- capture: kiln and torch.compile, each with a counting backend, first with fullgraph=True; where that raises,
  again with fullgraph=False to count the graphs. kiln must give at most torch's graph count, succeed with
  fullgraph=True wherever torch does, and compute what eager computes (the counting backend runs each graph as
  captured, so a difference is a capture bug). kiln runs with KILN_STRICT=0 here: a frame kiln fails to capture
  runs eagerly, contributes no graph and is reported (`kiln_fallbacks`) so that it cannot pass for fewer graphs.
- default: kiln's default backend (C++ code generation) against eager: outputs, loss and parameter gradients;
  a difference is checked against a float64 eager run and dropped where float32 rounding explains it. Where
  the model's own code computes otherwise when traced than when run (`TRACED_PATH`, with the reason), the
  reference is torch.compile's capture run eagerly (`backend="eager"`) instead of eager.
Results go to a JSON-lines file, one object per (architecture, mode); an existing file is resumed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # hf_architectures, and tests/ for `support` (run as a module)
from hf_architectures import ARCHITECTURES, INPUTS  # noqa: E402

from support.capture import CountingBackend  # noqa: E402
from support.time_limit import time_limit  # noqa: E402

MODES = ("inference", "training")
CHECKS = ("capture", "default")
ATOL, RTOL = 1e-4, 1e-3  # the default backend's fused reductions sum in another order than eager's
# a difference from eager that float32 rounding explains (see `beyond_rounding`): kiln no further from the
# float64 result than this share of the tensor's largest value, or this many times eager's own error
ROUNDING, EAGER_FACTOR = 2e-3, 10.0
# Architectures whose code takes another path when traced (transformers asks `is_tracing()`, which is true under
# torch.compile and kiln alike) with other values: their default-backend reference is torch.compile's capture,
# run eagerly. Why, for each:
TRACED_PATH = {
    "umt5": "transformers 5.17 builds UMT5's decoder self-attention with is_causal=False; run eagerly, the SDPA "
            "path drops the causal mask (masking_utils._ignore_causal_mask_sdpa: no mask unless is_tracing()), so "
            "the decoder attends to later tokens; traced, the mask is kept and the decoder is causal (5.24 builds "
            "it with is_causal=config.is_decoder: both paths agree)",
}


@dataclass
class CaseResult:
    """One (architecture, mode) of the sweep; None where a check did not run."""
    arch: str
    mode: str
    kind: str = ""
    torch_graphs: int | None = None
    kiln_graphs: int | None = None
    torch_fullgraph: bool | None = None
    kiln_fullgraph: bool | None = None
    kiln_capture_correct: bool | None = None
    torch_capture_correct: bool | None = None
    kiln_equals_torch: bool | None = None  # where kiln's capture differs from eager: whether it equals torch's
    kiln_fallbacks: dict = field(default_factory=dict)
    kiln_default: str | None = None  # "ok", "wrong: ..." or "error: ..."
    default_reference: str | None = None  # what kiln's default backend was compared with: "eager", "torch.compile"
    errors: dict = field(default_factory=dict)  # check -> the first line of what it raised
    seconds: float = 0.0

    def capture_ok(self) -> bool:
        """kiln's graph count at most torch's, fullgraph wherever torch's, eager's values (or, where the model
        computes otherwise when traced than when run, torch.compile's), no frame run eagerly."""
        return (self.kiln_graphs is not None and self.torch_graphs is not None
                and self.kiln_graphs <= self.torch_graphs and (self.kiln_fullgraph or not self.torch_fullgraph)
                and (bool(self.kiln_capture_correct) or self.traced_differently())
                and not self.kiln_fallbacks.get("frame"))

    def traced_differently(self) -> bool:
        """kiln and torch.compile both differ from eager, with equal values: the model's own code takes another
        path when traced (transformers asks `is_tracing()`/`is_compiling()`), not a capture bug."""
        return self.kiln_capture_correct is False and self.torch_capture_correct is False and bool(
            self.kiln_equals_torch)


def build(name: str, mode: str) -> torch.nn.Module:
    """The architecture with the same random weights every time."""
    torch.manual_seed(0)
    model = ARCHITECTURES[name].build()
    return model.train() if mode == "training" else model.eval()


def inputs(name: str, model, mode: str) -> dict:
    return INPUTS[ARCHITECTURES[name].kind](model, torch.Generator().manual_seed(1), mode == "training")


def step(fn, model, kwargs: dict, mode: str):
    """One call: (the output's tensors, the parameter gradients in training)."""
    if mode == "inference":
        with torch.no_grad():
            return tensors_of(fn(**kwargs)), {}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)  # models that draw random numbers in training (wav2vec2's masks) draw the same ones
    out = fn(**kwargs)
    out.loss.backward()
    return tensors_of(out), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def tensors_of(value, path="out") -> dict[str, torch.Tensor]:
    """Every tensor reachable in a model output (ModelOutput, tuple, cache object), by path."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach()}
    if hasattr(value, "to_tuple"):
        value = dict(value.items())
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif hasattr(value, "layers"):  # a transformers Cache: its layers' keys and values
        items = enumerate(value.layers)
    elif hasattr(value, "keys") and hasattr(value, "values") and not callable(value.keys):
        items = (("keys", value.keys), ("values", value.values))
    else:
        return {}
    out = {}
    for key, item in items:
        out.update(tensors_of(item, f"{path}.{key}"))
    return out


def differences(actual, expected) -> list[str]:
    """What differs between two step() results, named; empty when they agree within ATOL/RTOL."""
    found = []
    for label, a, e in (("output", actual[0], expected[0]), ("grad", actual[1], expected[1])):
        if a.keys() != e.keys():
            found.append(f"{label} names differ: {sorted(set(a) ^ set(e))[:4]}")
            continue
        for key in e:
            if a[key].shape != e[key].shape or not torch.allclose(a[key].float(), e[key].float(), atol=ATOL,
                                                                   rtol=RTOL, equal_nan=True):
                found.append(f"{label} {key}")
    return found


def first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def compile_with(compiler: str, model, backend, fullgraph: bool):
    if compiler == "torch":
        import torch._dynamo

        torch._dynamo.reset()
        return torch.compile(model, backend=backend, fullgraph=fullgraph)
    import kiln

    kiln.reset()
    return kiln.compile(model, backend=backend, fullgraph=fullgraph)


def count_graphs(compiler: str, name: str, mode: str, result: CaseResult, expected):
    """fullgraph=True, then (if it raised) fullgraph=False: whether one graph is possible, and how many graphs;
    returns the compiled step's result (None where it raised)."""
    from kiln import fallbacks

    for fullgraph in (True, False):
        model = build(name, mode)
        counter = CountingBackend()
        compiled = compile_with(compiler, model, counter, fullgraph)
        kwargs = inputs(name, model, mode)
        before = len(fallbacks.records())
        try:
            actual = step(compiled, model, kwargs, mode)
            eager_frames = [f for f in fallbacks.records()[before:] if f.kind == "frame"] if compiler == "kiln" else []
            if fullgraph and eager_frames:  # a frame kiln ran eagerly is not one graph
                raise RuntimeError(f"a frame ran eagerly: {eager_frames[0].describe()}")
        except Exception as exc:  # noqa: BLE001 (any failure is the result being measured)
            result.errors[f"{compiler}_fullgraph" if fullgraph else f"{compiler}_capture"] = first_line(exc)
            if fullgraph:
                setattr(result, f"{compiler}_fullgraph", False)
                continue
            return None
        if fullgraph:
            setattr(result, f"{compiler}_fullgraph", True)
        setattr(result, f"{compiler}_graphs", counter.graphs)
        wrong = differences(actual, expected)
        setattr(result, f"{compiler}_capture_correct", not wrong)
        if wrong:
            result.errors[f"{compiler}_capture_correct"] = "; ".join(wrong[:4])
        return actual
    return None


def run_capture(name: str, mode: str, result: CaseResult, expected, torch_known: dict | None = None) -> None:
    """Both compilers; torch.compile's side is taken from `torch_known` (an earlier run's result) if given."""
    from kiln import fallbacks

    torch_actual = None
    if torch_known and torch_known.get("torch_fullgraph") is not None:
        result.torch_graphs, result.torch_fullgraph = torch_known["torch_graphs"], torch_known["torch_fullgraph"]
        result.torch_capture_correct = torch_known.get("torch_capture_correct")
        result.errors.update({k: v for k, v in torch_known.get("errors", {}).items() if k.startswith("torch")})
    else:
        torch_actual = count_graphs("torch", name, mode, result, expected)
    os.environ["KILN_STRICT"] = "0"
    fallbacks.reset()
    kiln_actual = count_graphs("kiln", name, mode, result, expected)
    if result.kiln_capture_correct is False and torch_actual is not None:
        result.kiln_equals_torch = not differences(kiln_actual, torch_actual)
    result.kiln_fallbacks = {k: v for k, v in fallbacks.counts().items() if v}
    causes = [f"{f.kind}: {f.cause}" for f in fallbacks.records()]
    if causes:
        result.errors["kiln_fallbacks"] = causes[0][:300]


def reference(name: str, model):
    """What kiln's default backend must compute for `model`: eager, or (TRACED_PATH) torch.compile's capture of
    it, run eagerly."""
    if name not in TRACED_PATH:
        return model
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(model, backend="eager")


def run_default(name: str, mode: str, result: CaseResult, expected) -> None:
    import kiln

    result.default_reference = "torch.compile" if name in TRACED_PATH else "eager"
    if name in TRACED_PATH:
        model = build(name, mode)
        expected = step(reference(name, model), model, inputs(name, model, mode), mode)
    kiln.reset()
    model = build(name, mode)
    compiled = kiln.compile(model)
    try:
        actual = step(compiled, model, inputs(name, model, mode), mode)
        wrong = differences(actual, expected)
        if wrong:
            wrong = beyond_rounding(name, mode, actual, expected, wrong)
        result.kiln_default = "ok" if not wrong else "wrong: " + "; ".join(wrong[:4])
    except Exception as exc:  # noqa: BLE001
        result.kiln_default = "error: " + first_line(exc)


def beyond_rounding(name: str, mode: str, actual, expected, wrong: list[str]) -> list[str]:
    """Of the differences `wrong` names, those that float32 rounding does not explain (against `reference`).

    Element-wise tolerances flag rounding where the computation is ill-conditioned: a batch norm over two
    values (a batch of 2 at 1x1 resolution, mobilenet_v2's last layers) amplifies the order of a sum into
    the gradients of every layer before it. The float64 eager run is the truth both float32 runs round: a
    difference is kiln's error only when kiln is further from it than `ROUNDING` of the tensor's largest
    value and than `EAGER_FACTOR` times eager's own float32 error.
    """
    try:
        truth = _float64_step(name, mode)
    except Exception:  # noqa: BLE001 (an architecture without float64 kernels: the differences stand)
        return wrong
    found = []
    for label in wrong:
        kind, _, key = label.partition(" ")
        index = 0 if kind == "output" else 1
        ref = truth[index].get(key)
        if ref is None or ref.shape != expected[index][key].shape:
            found.append(label)
            continue
        kiln_error = (actual[index][key].double() - ref).abs().max().item()
        eager_error = (expected[index][key].double() - ref).abs().max().item()
        if kiln_error > ATOL + max(ROUNDING * ref.abs().max().item(), EAGER_FACTOR * eager_error):
            found.append(label)
    return found


def _float64_step(name: str, mode: str):
    model = build(name, mode).double()
    kwargs = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
              for k, v in inputs(name, model, mode).items()}
    return step(reference(name, model), model, kwargs, mode)


def run_case(name: str, mode: str, checks=CHECKS, limit: int = 900, torch_known: dict | None = None) -> CaseResult:
    """Every requested check of one architecture in one mode."""
    start = time.perf_counter()
    result = CaseResult(name, mode, ARCHITECTURES[name].kind)
    try:
        with time_limit(limit):
            model = build(name, mode)
            expected = step(model, model, inputs(name, model, mode), mode)
            if "capture" in checks:
                run_capture(name, mode, result, expected, torch_known)
            if "default" in checks:
                run_default(name, mode, result, expected)
    except Exception as exc:  # noqa: BLE001
        result.errors["case"] = first_line(exc)
        traceback.print_exc()
    result.seconds = round(time.perf_counter() - start, 1)
    return result


def _done(path: str) -> set[tuple[str, str]]:
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {(r["arch"], r["mode"]) for r in map(json.loads, filter(str.strip, f))}


def sweep(names, modes, checks, out: str | None, torch_known: dict | None = None) -> list[CaseResult]:
    done = _done(out) if out else set()
    results = []
    for name in names:
        for mode in modes:
            if (name, mode) in done:
                continue
            result = run_case(name, mode, checks, torch_known=(torch_known or {}).get((name, mode)))
            results.append(result)
            print(json.dumps(asdict(result)), flush=True)
            if out:
                with open(out, "a") as f:
                    f.write(json.dumps(asdict(result)) + "\n")
    return results


def _mark(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return "-" if value is None else str(value)


def table(rows: list[dict]) -> str:
    """The Markdown table of a sweep: a summary, then one line per (architecture, mode)."""
    results = [CaseResult(**r) for r in rows]
    lines = [summary(results), "",
             "| architecture | kind | mode | graphs torch | graphs kiln | fullgraph torch | fullgraph kiln "
             "| kiln capture = eager | kiln default = eager | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.kind, r.arch, r.mode)):
        notes = [f"kiln fallbacks {r.kiln_fallbacks}"] if r.kiln_fallbacks else []
        if r.default_reference not in (None, "eager"):
            notes.append(f"default compared with {r.default_reference} (the model traces another path)")
        if r.errors:
            notes.append("; ".join(f"{k}: {v}" for k, v in r.errors.items()).replace("|", "/")[:240])
        notes = "; ".join(notes)
        lines.append(f"| {r.arch} | {r.kind} | {r.mode} | {_mark(r.torch_graphs)} | {_mark(r.kiln_graphs)} "
                     f"| {_mark(r.torch_fullgraph)} | {_mark(r.kiln_fullgraph)} | {_mark(r.kiln_capture_correct)} "
                     f"| {r.kiln_default or '-'} | {notes} |")
    return "\n".join(lines)


def summary(results: list[CaseResult]) -> str:
    captured = [r for r in results if r.torch_graphs is not None or r.torch_fullgraph is not None]
    defaults = [r for r in results if r.kiln_default is not None]
    archs = {r.arch for r in results}
    return "\n".join([
        f"- architectures: {len(archs)}; (architecture, mode) pairs: {len(results)}",
        f"- kiln graphs <= torch graphs: {sum(r.kiln_graphs is not None and r.torch_graphs is not None and r.kiln_graphs <= r.torch_graphs for r in captured)} / {len(captured)}",  # noqa: E501
        f"- fullgraph=True succeeds: torch {sum(bool(r.torch_fullgraph) for r in captured)}, kiln "
        f"{sum(bool(r.kiln_fullgraph) for r in captured)} / {len(captured)}; kiln fails where torch succeeds: "
        f"{sum(bool(r.torch_fullgraph) and not r.kiln_fullgraph for r in captured)}",
        f"- total graphs: torch {sum(r.torch_graphs or 0 for r in captured)}, kiln "
        f"{sum(r.kiln_graphs or 0 for r in captured)}",
        f"- kiln capture computes what eager computes: {sum(bool(r.kiln_capture_correct) for r in captured)} / "
        f"{len(captured)}; torch.compile's: {sum(bool(r.torch_capture_correct) for r in captured)} / "
        f"{sum(r.torch_capture_correct is not None for r in captured)} checked; kiln and "
        f"torch.compile differ from eager with equal values (the model traces another path): "
        f"{sum(r.traced_differently() for r in captured)}",
        f"- all capture checks pass: {sum(r.capture_ok() for r in captured)} / {len(captured)}",
        f"- kiln default backend = eager: {sum(r.kiln_default == 'ok' for r in defaults)} / {len(defaults)} "
        f"(of them compared with torch.compile's capture, the model tracing another path: "
        f"{sum(r.default_reference == 'torch.compile' for r in defaults)})",
    ])


def merged_rows(paths: list[str]) -> dict[tuple[str, str], dict]:
    """Results files merged by (architecture, mode): a check in a later file overrides an earlier file's."""
    rows: dict[tuple[str, str], dict] = {}
    for path in paths:
        with open(path) as f:
            for r in map(json.loads, filter(str.strip, f)):
                row = rows.setdefault((r["arch"], r["mode"]), {})
                old_errors, new_errors = row.get("errors", {}), r.pop("errors")
                if r.get("kiln_fullgraph") is not None:  # a new capture run replaces the old one's kiln side
                    old_errors = {k: v for k, v in old_errors.items() if not k.startswith("kiln")}
                    for key in ("kiln_graphs", "kiln_capture_correct", "kiln_equals_torch", "kiln_fallbacks"):
                        row.pop(key, None)
                row.update({k: v for k, v in r.items() if v not in (None, {})}, errors={**old_errors, **new_errors})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="every architecture")
    parser.add_argument("--only", default="", help="comma-separated architecture names")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--checks", default=",".join(CHECKS))
    parser.add_argument("--out", help="JSON-lines results file (appended to; cases already in it are skipped)")
    parser.add_argument("--table", nargs="+", help="print the Markdown table of these results files")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--torch-from", nargs="+", default=[],
                        help="take torch.compile's graph counts from these earlier results (torch unchanged)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{n}\t{a.kind}\t{a.model}" for n, a in ARCHITECTURES.items()))
        return 0
    if args.table:
        print(table(list(merged_rows(args.table).values())))
        return 0
    names = list(ARCHITECTURES) if args.all else [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown or not names:
        parser.error(f"unknown architectures {unknown}" if unknown else "give --all or --only")
    torch.set_num_threads(1)
    results = sweep(names, args.modes.split(","), args.checks.split(","), args.out, merged_rows(args.torch_from))
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
