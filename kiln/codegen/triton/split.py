"""Split reductions: a long reduction with few rows runs as two kernels so that it fills the GPU.

A looped reduction gives each program XBLOCK rows; with few rows (BatchNorm's
per-channel statistics, a loss summed to a scalar) that is a handful of programs
walking millions of elements each. Split, the reduction range is cut into RSPLIT
chunks of RCHUNK elements:

  <name>_partial   grid (row blocks, RSPLIT): the inner segment (prologue, stored
                   pointwise nodes) over one chunk, each reduction's partial result
                   (sum, max, argmax's value and index, Welford's mean/M2/count)
                   written to a workspace [RSPLIT, xnumel] (chunk-major: a program's
                   partials of neighbouring rows, a column reduction's columns, are
                   stored coalesced);
  <name>           grid (row blocks): combines the RSPLIT partials of each row with
                   the reduction's own combine function, stores the results and runs
                   the outer segments (the epilogue) as the one-kernel form would.
                   RSPLIT need not be a power of two: the combine reads SBLOCK (the
                   next one) partials per row, masked.

The workspaces of one dtype are parts of one allocation (a Welford's mean, M2 and
count: one allocation per call, not three), each kernel offsetting its pointer.

Only groups shaped [inner segment, outer segments...] are split (no inner segment
reads a reduction result back). The schedule is unchanged: the pair is one
kernel to the wrapper.
"""
from __future__ import annotations

import torch

from kiln.codegen.cse import Scope
from kiln.codegen.index_printer import pyexpr
from kiln.codegen.triton import ops
from kiln.codegen.triton.heuristics import next_pow2
from kiln.codegen.triton.kernel import TritonKernel, decompose_index, reduction_result, reduction_result_dtype
from kiln.lower.index import product

# workspace parts of each reduction family: (part, dtype of the partial: None = the body's compute type)
PARTS = {"welford": (("mean", None), ("m2", None), ("weight", None)),
         "argmax": (("value", None), ("index", torch.int64)),
         "argmin": (("value", None), ("index", torch.int64))}
DEFAULT_PARTS = (("value", None),)


def splittable(group) -> bool:
    segs = group.segments
    return bool(segs) and segs[0].inner and segs[0].has_reduction() and not any(s.inner for s in segs[1:])


class SplitReductionKernel(TritonKernel):
    def generate(self) -> str:
        g, cfg = self.group, self.config
        self.size_args = sorted(self.group.size_symbols(), key=str)
        self.workspaces: list = []   # (name, torch dtype, family, part, identity)
        # ---- kernel 1: partials
        self._in_inner = False
        self._header()
        self.line("rsplit = tl.program_id(1)")
        names = ", ".join(n.name for n in g.segments[0].nodes)
        self.line(f"# segment 0 (inner, chunk rsplit of {cfg.RSPLIT}): {names}")
        self._looped_segment(g.segments[0], Scope())
        partial_body, self.lines = self.lines, []
        self.partial_args = [b for b in self.inputs if b not in self.outputs] + list(self.outputs)
        partial_inputs, partial_outputs = dict(self.inputs), dict(self.outputs)
        self.inputs, self.outputs = {}, {}
        # ---- kernel 2: combine the partials, then the epilogue
        self._header()
        self.line("sindex = tl.arange(0, SBLOCK)[None, :]")
        self.line("smask = xmask & (sindex < RSPLIT)")
        self._combine_partials()
        scope = Scope()
        for k, seg in enumerate(g.segments[1:], 1):
            self.line(f"# segment {k} (outer): {', '.join(n.name for n in seg.nodes)}")
            self._outer_segment(seg, scope)
        combine_body = self.lines
        self.combine_args = [b for b in self.inputs if b not in self.outputs] + list(self.outputs)
        # ---- what the wrapper sees: one kernel
        ins = {**partial_inputs, **self.inputs}
        outs = {**partial_outputs, **self.outputs}
        self.inputs, self.outputs = ins, outs
        self.arg_names = [b for b in ins if b not in outs] + list(outs)
        sizes = [str(s) for s in self.size_args]
        ws = self._workspace_arguments()
        offsets = self._workspace_offsets()
        partial_body, combine_body = offsets + partial_body, offsets + combine_body
        p_params = ws + self.partial_args + sizes + ["xnumel", "rnumel"] + [
            "XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "RSPLIT: tl.constexpr", "RCHUNK: tl.constexpr"]
        c_params = ws + self.combine_args + sizes + ["xnumel", "XBLOCK: tl.constexpr", "RSPLIT: tl.constexpr",
                                                      "SBLOCK: tl.constexpr"]
        doc = self._docstring()
        src = ["@triton.jit", f"def {self.jit_name}_partial({', '.join(p_params)}):", f'    """{doc} (partials)"""']
        src += partial_body
        src += ["", "", "@triton.jit", f"def {self.jit_name}({', '.join(c_params)}):",
                f'    """{doc} (combine + epilogue)"""']
        src += combine_body
        self.jit_source = "\n".join(src)
        return self.jit_source + "\n\n\n" + self._launcher()

    def _workspace_groups(self) -> dict:
        """{torch dtype: the names of its workspaces}, in order: one allocation each."""
        groups: dict = {}
        for name, dtype, *_ in self.workspaces:
            groups.setdefault(dtype, []).append(name)
        return groups

    def _workspace_arguments(self) -> list[str]:
        """The kernels' workspace parameters: one per dtype, named after its first workspace."""
        return [names[0] for names in self._workspace_groups().values()]

    def _workspace_offsets(self) -> list[str]:
        """Lines binding each further workspace of a dtype to its part of the allocation ([RSPLIT, xnumel] each)."""
        return [f"    {name} = {names[0]} + {k} * RSPLIT * xnumel"
                for names in self._workspace_groups().values() for k, name in enumerate(names) if k]

    def _docstring(self) -> str:
        g = self.group
        return (f"split reduction over outer ({', '.join(map(str, g.outer))}) x inner "
                f"({', '.join(map(str, g.inner))}): " + ", ".join(n.name for n in g.nodes))

    def _header(self) -> None:
        g, cfg = self.group, self.config
        pid = "tl.program_id(0)" if cfg.index_dtype == "tl.int32" else "tl.program_id(0).to(tl.int64)"
        self.line(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        self.line("xmask = xindex < xnumel")
        for s in decompose_index("xindex", g.outer, list(g.outer_vars())):
            self.line(s)

    def _loop_range(self) -> str:
        return "range(rsplit * RCHUNK, rsplit * RCHUNK + RCHUNK, RBLOCK)"

    def _finish_looped(self, keys: dict, results: dict) -> None:
        """Write each reduction's partial (all its parts) to its workspace, chunk-major [RSPLIT, xnumel]."""
        self._keys = keys
        self._ws_of = {}
        for key, nodes in keys.items():
            family = key[0]
            body_dtype = nodes[0].data.body.dtype
            names = {}
            for part, dtype in PARTS.get(family, DEFAULT_PARTS):
                dtype = dtype or (torch.float32 if body_dtype in ops.ROUNDED else body_dtype)
                name = f"ws{len(self.workspaces)}"
                ident = "0" if family == "welford" else (
                    str(2**63 - 1) if part == "index" else ops.identity(family, body_dtype))
                self.workspaces.append((name, dtype, family, part, ident))
                names[part] = name
                self.line(f"tl.store({name} + (rsplit * xnumel + xindex), {results[key][part]}, xmask)")
            self._ws_of[key] = names

    def _combine_partials(self) -> None:
        by_name = {w[0]: w for w in self.workspaces}
        for key, nodes in self._keys.items():
            family = key[0]
            loaded = {}
            for part, name in self._ws_of[key].items():
                var = self.new_tmp("part")
                self.line(f"{var} = tl.load({name} + (sindex * xnumel + xindex), smask, other={by_name[name][4]})")
                loaded[part] = var
            out = self.new_tmp("red")
            if family == "welford":
                self.line(f"{out}_mean, {out}_m2, _ = tl.reduce(({loaded['mean']}, {loaded['m2']}, "
                          f"{loaded['weight']}), 1, kiln_welford_combine)")
                parts = {"mean": f"{out}_mean", "m2": f"{out}_m2"}
            elif family in ("argmax", "argmin"):
                self.line(f"_, {out}_index = tl.reduce(({loaded['value']}, {loaded['index']}), 1, "
                          f"kiln_{family}_combine)")
                parts = {"index": f"{out}_index"}
            else:
                self.line(f"{out} = {ops.REDUCE_BLOCK[family].format(v=loaded['value'])}")
                parts = {"value": out}
            for var in parts.values():
                self.line(f"{var} = {var}[:, None]")
            for node in nodes:
                self._store(node, reduction_result(parts, node.data.reduction_type), reduction_result_dtype(node))

    def _launcher(self) -> str:
        g, cfg = self.group, self.config
        sizes = [str(s) for s in self.size_args]
        ws = self._workspace_arguments()
        first = self.arg_names[0]
        lines = [f"def {self.entry}({', '.join((self.signature or self.arg_names) + sizes)}):"]
        numbers = self._launch_numbers(product(g.outer), product(g.inner))
        if numbers is None:  # an empty range of static size
            lines.append("    return")
        else:
            prelude, xnumel, rnumel, partial_grid, combine_grid, workspace = numbers
            lines += prelude
            for name, (dtype, parts) in zip(ws, self._workspace_groups().items()):
                length = workspace if len(parts) == 1 else f"{len(parts)} * {workspace}"
                lines.append(f"    {name} = torch.empty({length}, dtype={dtype}, device={first}.device)")
            lines.append(f"    _launch_{self.jit_name}_partial{self.launch_suffix}(({partial_grid}, {cfg.RSPLIT}), "
                         f"{', '.join(ws + self.partial_args + sizes + [xnumel, rnumel])})")
            lines.append(f"    _launch_{self.jit_name}{self.launch_suffix}({combine_grid}, "
                         f"{', '.join(ws + self.combine_args + sizes + [xnumel])})")
        return "\n".join(self._launcher_objects()) + "\n\n\n" + "\n".join(lines) + "\n"

    def _launch_numbers(self, outer, inner) -> tuple | None:
        """(lines binding them, xnumel, rnumel, the two grids, the workspace length) as Python source: numbers
        for static sizes (every launch runs this code: nothing left to compute per call; None for an empty
        range), expressions over the wrapper's size symbols otherwise."""
        cfg, cx = self.config, self.config.COMBINE_XBLOCK
        if outer.is_Integer and inner.is_Integer:
            x = int(outer)
            if x <= 0:
                return None
            return [], str(x), str(int(inner)), str(-(-x // cfg.XBLOCK)), str(-(-x // cx)), str(x * cfg.RSPLIT)
        prelude = [f"    xnumel = {pyexpr(outer)}", f"    rnumel = {pyexpr(inner)}", "    if xnumel <= 0:",
                   "        return"]
        return (prelude, "xnumel", "rnumel", f"(xnumel + {cfg.XBLOCK - 1}) // {cfg.XBLOCK}",
                f"(xnumel + {cx - 1}) // {cx}", f"xnumel * {cfg.RSPLIT}")

    def _launcher_objects(self) -> list[str]:
        """The `Launcher`s of the partial and the combine kernel."""
        cfg, ws = self.config, self._workspace_arguments()
        cx, sblock = cfg.COMBINE_XBLOCK, next_pow2(cfg.RSPLIT)
        return [
            f"_launch_{self.jit_name}_partial{self.launch_suffix} = "
            f"Launcher({self.jit_name}_partial, {len(ws) + len(self.partial_args)}, "
            f"num_warps={cfg.num_warps}, XBLOCK={cfg.XBLOCK}, RBLOCK={cfg.RBLOCK}, RSPLIT={cfg.RSPLIT}, "
            f"RCHUNK={cfg.RCHUNK})",
            f"_launch_{self.jit_name}{self.launch_suffix} = "
            f"Launcher({self.jit_name}, {len(ws) + len(self.combine_args)}, "
            f"num_warps={max(1, min(8, cx * sblock // 512))}, XBLOCK={cx}, RSPLIT={cfg.RSPLIT}, SBLOCK={sblock})",
        ]

    def precompile(self, module) -> None:
        """Compile both kernels now (dtypes of their tensor arguments, static integer arguments)."""
        g = self.group
        sizes = [int(v) if v.is_Integer else 2 for v in self.size_args]
        numels = [int(v) if v.is_Integer else 2 for v in (product(g.outer), product(g.inner))]
        ws_dtypes = list(self._workspace_groups())
        dt = [self.layouts[b].dtype for b in self.partial_args]
        partial = getattr(module, f"_launch_{self.jit_name}_partial{self.launch_suffix}")
        partial.precompile(ws_dtypes + dt, sizes + numels)
        dc = ws_dtypes + [self.layouts[b].dtype for b in self.combine_args]
        getattr(module, f"_launch_{self.jit_name}{self.launch_suffix}").precompile(dc, sizes + numels[:1])
