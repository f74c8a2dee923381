"""max-autotune for the Triton target: every kernel group emitted as several candidates behind an `Autotuned`.

For a plain group the candidates are the configurations of `heuristics.candidates`
(the heuristic's choice first); for a matmul template group they are the tile
configurations of `templates.matmul_configs` plus `aten` (ATen's matmul, then the
epilogue as a kernel of its own). Each candidate is a launcher `<group>__c<k>`
with the group's argument list; the group's name is bound to
`Autotuned(<group>, <hash of the group's source>, {label: launcher}, <tensors>)`,
which the wrapper calls like any launcher (kiln/runtime/autotune.py benchmarks on
the first call and keeps the fastest). Candidates of one kind share their
@triton.jit function (block sizes are constexpr arguments).
"""
from __future__ import annotations

import hashlib
import logging

from kiln.codegen.triton.heuristics import candidates, label, unsplit
from kiln.codegen.triton.kernel import TritonKernel
from kiln.codegen.triton.libdevice import interpreting
from kiln.codegen.triton.split import SplitReductionKernel, splittable
from kiln.codegen.triton.templates import (
    MatmulSpec,
    MatmulTemplateKernel,
    aten_candidate,
    epilogue_group,
    matmul_configs,
)
from kiln.schedule.fusion import KernelGroup

log = logging.getLogger("kiln.autotune")

HEADER = '''from kiln.codegen.triton.templates import aten_matmul_out
from kiln.runtime.autotune import Autotuned
'''


def candidate_limit() -> int:
    """Configurations tried per kernel: few under the interpreter (timings mean nothing there, runs are slow)."""
    return 3 if interpreting() else 8


class TunedKernel:
    """What the wrapper and `load_kernels` see of an autotuned group: the first candidate's arguments."""

    takes_tensors = True

    def __init__(self, name: str, variants: list, source: str, labels: list[str], extra: list | None = None,
                 template: bool = False):
        base = variants[0]
        self.name = name
        self.variants = variants
        self.labels = labels
        self.extra = extra or []
        self.inputs, self.outputs = base.inputs, base.outputs
        self.arg_names, self.size_args = base.arg_names, base.size_args
        self.jit_name = base.jit_name
        self.source = source
        self.template = template

    def precompile(self, module) -> None:
        """Compile the first candidate (and the `aten` candidate's epilogue) now; the others compile when
        benchmarked, where one that fails is just not chosen. A template that does not compile leaves `aten`."""
        for k in self.extra:
            k.precompile(module)
        if not self.template:
            self.variants[0].precompile(module)
            return
        try:
            self.variants[0].precompile(module)
        except Exception as e:  # noqa: BLE001 - the aten candidate remains
            log.info("autotune %s: template %s does not compile (%s: %s)", self.name, self.labels[0],
                     type(e).__name__, e)


def _group_source(name: str, variants: list, labels: list[str], extra_sources: list[str], extra_labels: list) -> str:
    jit: dict[str, str] = {}
    for v in variants:
        jit.setdefault(v.jit_name, v.jit_source)
    parts = list(jit.values()) + extra_sources + [v._launcher() for v in variants]
    body = "\n\n".join(parts)
    digest = hashlib.sha256(body.encode()).hexdigest()
    entries = [(lab, v.entry) for lab, v in zip(labels, variants)] + list(extra_labels)
    table = ", ".join(f"{lab!r}: {entry}" for lab, entry in entries)
    line = f"{name} = Autotuned({name!r}, {digest!r}, {{{table}}}, {len(variants[0].arg_names)})\n"
    return body + "\n\n" + line


def _variant(group: KernelGroup, layouts: dict, external, cfg, k: int, kinds: set) -> TritonKernel:
    if cfg.kind == "split" and splittable(group):
        kern = SplitReductionKernel(group, layouts, cfg, external=external)
    else:
        kern = TritonKernel(group, layouts, unsplit(group, cfg) if cfg.kind == "split" else cfg,
                            external=external)
    if len(kinds) > 1:
        kern.jit_name += f"_{kern.config.kind}"
    kern.entry, kern.launch_suffix = f"{group.name}__c{k}", f"_c{k}"
    kern.source = kern.generate()
    return kern


def _same_arguments(base, v) -> bool:
    """`v` takes the buffers and sizes of `base` (then its launcher is written with `base`'s argument order)."""
    if set(v.arg_names) != set(base.arg_names) or list(v.size_args) != list(base.size_args):
        return False
    if list(v.arg_names) != list(base.arg_names):
        v.signature = list(base.arg_names)
    return True


def tuned_kernel(group: KernelGroup, layouts: dict, external) -> TunedKernel:
    """A plain group under max-autotune: one candidate per configuration."""
    cfgs = candidates(group, layouts, candidate_limit())
    kinds = {("looped" if c.kind == "split" and not splittable(group) else c.kind) for c in cfgs}
    variants, labels, jit = [], [], {}
    for k, cfg in enumerate(cfgs):
        v = _variant(group, layouts, external, cfg, k, kinds)
        lab = label(v.config)
        if lab in labels or (variants and not _same_arguments(variants[0], v)):
            continue
        if jit.get(v.jit_name, v.jit_source) != v.jit_source:  # same name, other code: keep it apart
            v.jit_name += f"_v{k}"
            v.source = v.generate()
        jit[v.jit_name] = v.jit_source
        variants.append(v)
        labels.append(lab)
    return TunedKernel(group.name, variants, _group_source(group.name, variants, labels, [], []), labels)


def tuned_template(group: KernelGroup, layouts: dict, external, spec: MatmulSpec) -> TunedKernel:
    """A matmul template group: tile configurations of the template, and `aten` (+ the epilogue kernel)."""
    limit = 2 if interpreting() else candidate_limit()
    variants, labels = [], []
    for k, mcfg in enumerate(matmul_configs(spec.M, spec.N, spec.K, limit)):
        v = MatmulTemplateKernel(group, layouts, spec, mcfg, external)
        v.entry, v.launch_suffix = f"{group.name}__c{k}", f"_c{k}"
        v.source = v.generate()
        variants.append(v)
        labels.append(mcfg.label())
    base = variants[0]
    epi_group = epilogue_group(group)
    extra, extra_sources = [], []
    if epi_group is not None:
        epi = TritonKernel(epi_group, layouts, external=external)
        epi.entry = f"{group.name}__epilogue"
        epi.source = epi.generate()
        extra.append(epi)
        extra_sources.append(epi.source)
    aten_entry = f"{group.name}__aten"
    sizes = [str(s) for s in base.size_args]
    extra_sources.append(aten_candidate(group, spec, aten_entry, list(base.arg_names), sizes,
                                        extra[0] if extra else None, layouts))
    source = _group_source(group.name, variants, labels, extra_sources, [("aten", aten_entry)])
    return TunedKernel(group.name, variants, source, labels + ["aten"], extra, template=True)


__all__ = ["HEADER", "TunedKernel", "tuned_kernel", "tuned_template", "candidate_limit"]
