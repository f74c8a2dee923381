"""The random program generator: `generate(seed)` returns the Python source of one valid program.

A program is plain Python text (readable, printable, replayable by pasting it into a test):

    CALLS = 3            # the harness calls f this many times, with the inputs of `inputs(call)`
    DYNAMIC = None       # kiln.compile(f, dynamic=DYNAMIC)
    NO_GRAD = False      # calls run under torch.no_grad()
    def before_call(call): ...   # Python state changed between calls (globals, class attributes)
    def inputs(call): ...        # the arguments of call `call`: sizes and ranks change between calls
    def f(a, b): ...             # the function under test

The body of `f` is grown one statement at a time from the templates in ops.py. Each candidate is run
eagerly on the inputs of every call; one that raises is dropped, so every emitted program runs eagerly
(except for a last statement that some programs keep on purpose because eager raises there: the
compiled program must raise the same exception).
"""
from __future__ import annotations

import random
import warnings

import torch

from tests.fuzz import runtime
from tests.fuzz.ops import FAMILIES, FILLS, Op

DTYPES = [(torch.float32, 6), (torch.float64, 1), (torch.int64, 2), (torch.int32, 1), (torch.bool, 1),
          (torch.bfloat16, 1)]
DTYPE_NAMES = {torch.float32: "torch.float32", torch.float64: "torch.float64", torch.int64: "torch.int64",
               torch.int32: "torch.int32", torch.bool: "torch.bool", torch.bfloat16: "torch.bfloat16"}
# ops whose eager result on a zero divisor is undefined on GPUs (raises on the CPU)
GPU_UNDEFINED = ("{a} // {b}", "{a} % {b}")


def weighted(rng: random.Random, items):
    values, weights = zip(*items)
    return rng.choices(values, weights)[0]


class Builder:
    """Grows one program: its input makers, then statements checked against eager, then the return."""

    def __init__(self, seed: int, device: str = "cpu"):
        self.rng = random.Random(seed)
        self.seed, self.device = seed, device
        rng = self.rng
        self.calls = rng.choice([2, 3, 3])
        self.sizes = {"n": rng.sample([2, 3, 4, 5, 6, 7], 3), "m": [rng.choice([2, 3, 4, 1]) for _ in range(3)]}
        self.no_grad = rng.random() < 0.15
        self.dynamic = rng.choice([None, None, None, True, False])
        self.tensors: list[str] = []      # tensor variables, oldest first
        self.pythons: list[str] = []      # Python values (.item(), .tolist(), sizes)
        self.body: list[str] = []
        self.tail: list[str] = []         # a last statement eager raises on, if any
        self.counter = 0
        for _ in range(20):  # an alias like `b = a[::2]` of a 0-d `a` raises: draw the inputs again
            self.header = self._header()
            self.namespace = runtime.fresh_namespace()
            exec(compile(self.header, "<fuzz header>", "exec"), self.namespace)
            try:
                self.envs = self._fresh_envs()
                break
            except Exception:  # noqa: BLE001
                continue
        else:
            raise RuntimeError(f"fuzz seed {seed}: no valid inputs in 20 draws")

    # -- inputs ------------------------------------------------------------------------------
    def _shape(self) -> str:
        rng = self.rng
        rank = weighted(rng, [(0, 1), (1, 3), (2, 4), (3, 1)])
        dims = [weighted(rng, [("n", 4), ("m", 1), ("1", 1), ("2", 1), ("3", 2), ("4", 1)]) for _ in range(rank)]
        shape = f"({', '.join(dims)}{',' if rank == 1 else ''})"
        if rank and rng.random() < 0.1:  # the last call gets one more dimension
            per_call = [shape] * (self.calls - 1) + [f"(2, {', '.join(dims)})"]
            return f"[{', '.join(per_call)}][call]"
        return shape

    def _input_line(self, name: str, earlier: list[str]) -> str:
        rng = self.rng
        if earlier and rng.random() < 0.15:
            base = rng.choice(earlier)
            return f"{name} = " + rng.choice([base, f"{base}[1:]", f"{base}[::2]", f"{base}.detach()[:2]",
                                               f"{base}.flip(0) if {base}.dim() else {base}"])
        dtype = weighted(rng, DTYPES)
        shape, dname = self._shape(), DTYPE_NAMES[dtype]
        if dtype.is_floating_point:
            grad = ", grad=True" if not self.no_grad and rng.random() < 0.35 else ""
            return f"{name} = randn(g, {shape}, {dname}{grad})"
        if dtype == torch.bool:
            return f"{name} = bools(g, {shape})"
        edges = ", edges=True" if rng.random() < 0.5 else ""
        return f"{name} = ints(g, {shape}, {dname}{edges})"

    def _header(self) -> str:
        rng = self.rng
        self.inputs = list("abcd"[:rng.randint(1, 4)])
        self.tensors = list(self.inputs)
        lines = [f"# kiln fuzz program, seed {self.seed}", f"CALLS = {self.calls}", f"DYNAMIC = {self.dynamic}",
                 f"NO_GRAD = {self.no_grad}", ""]
        if rng.random() < 0.3:
            scales = tuple(rng.choice([2.0, 2.0, 0.5, -1.0]) for _ in range(3))
            lines += ["def before_call(call):", "    global SCALE", f"    SCALE = {scales}[call] + 1",
                      f"    Obj.scale = {scales}[call]", ""]
        lines += ["def inputs(call):", f"    g = torch.Generator().manual_seed({self.seed % 100000} * 10 + call)",
                  f"    n, m = {tuple(self.sizes['n'])}[call], {tuple(self.sizes['m'])}[call]"]
        for i, name in enumerate(self.inputs):
            lines.append("    " + self._input_line(name, self.inputs[:i]))
        lines.append(f"    return [{', '.join(self.inputs)}]")
        return "\n".join(lines) + "\n"

    def _fresh_envs(self) -> list[dict]:
        envs = []
        for call in range(self.calls):
            env = dict(self.namespace)
            env.update(zip(self.inputs, self.namespace["inputs"](call)))
            envs.append(env)
        for stmt in self.body:  # replay what was accepted (statements may have changed inputs in place)
            self._run(stmt, envs)
        return envs

    # -- statements --------------------------------------------------------------------------
    def _run(self, stmt: str, envs: list[dict]) -> None:
        code = compile(stmt, "<fuzz>", "exec")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.no_grad() if self.no_grad else torch.enable_grad():
                for env in envs:
                    exec(code, env)

    def _try(self, stmt: str) -> Exception | None:
        """Run `stmt` on every call's variables; on failure rebuild them (a call may have run part of it)."""
        try:
            self._run(stmt, self.envs)
            return None
        except Exception as e:
            self.envs = self._fresh_envs()
            return e

    def _operands(self, op: Op) -> list[str] | None:
        env = self.envs[0]
        live = [n for n in self.tensors if isinstance(env.get(n), torch.Tensor)]
        if op.operands == 1:
            choices = [(n,) for n in live if op.where(env[n])]
        else:
            choices = [(x, y) for x in live for y in live if op.where(env[x], env[y])]
        if not choices:
            return None
        weights = [1 + sum(live.index(n) for n in c) for c in choices]  # prefer recent values
        return list(self.rng.choices(choices, weights)[0])

    def _statement(self, op: Op) -> str | None:
        names = self._operands(op)
        if names is None or (op.needs_python and not self._numbers()):
            return None
        env = self.envs[0]
        fields = {"a": names[0], "b": names[-1], "out": f"t{self.counter}", "p": f"p{self.counter}"}
        if op.needs_python:
            fields["x"] = self.rng.choice(self._numbers())
        for key, fill in FILLS.items():
            fields[key] = fill(self.rng, env[names[0]])
        code = op.code.format(**fields)
        return f"{fields['out']} = {code}" if op.makes == "tensor" else code

    def _numbers(self) -> list[str]:
        return [p for p in self.pythons if isinstance(self.envs[0].get(p), (int, float)) and
                not isinstance(self.envs[0].get(p), bool)]

    def _pick_op(self) -> Op:
        family = weighted(self.rng, [(ops, w) for _, ops, w in FAMILIES])
        op = self.rng.choice(family)
        if self.device != "cpu" and op.code in GPU_UNDEFINED:
            return self._pick_op()
        return op

    def add_statement(self, keep_raising: bool = False) -> bool:
        """Add one statement eager runs (or, with keep_raising, one eager raises on); True if one was added."""
        for _ in range(25):
            op = self._pick_op()
            stmt = self._statement(op)
            if stmt is None:
                continue
            error = self._try(stmt)
            if (error is not None) != keep_raising:
                continue
            if keep_raising:  # not replayed: nothing after it runs
                self.tail.append(stmt)
                return True
            self.body.append(stmt)
            self.counter += 1
            if op.makes in ("tensor", "block"):
                self.tensors.append(f"t{self.counter - 1}")
            elif op.makes == "python":
                self.pythons.append(f"p{self.counter - 1}")
            return True
        return False

    # -- the return ----------------------------------------------------------------------------
    def _return_expr(self) -> str:
        rng = self.rng
        recent = [n for n in self.tensors if isinstance(self.envs[0].get(n), torch.Tensor)]
        picked = rng.sample(recent[-4:], min(len(recent[-4:]), rng.randint(1, 3)))
        extra = []
        if rng.random() < 0.15:
            extra.append(rng.choice(self.inputs))
        if rng.random() < 0.15:
            extra.append(f"{picked[0]}.detach()")
        if rng.random() < 0.2:
            extra.append(f"{picked[0]}[{rng.choice(['::2', '1:', '0', '...', ':1'])}]")
        if rng.random() < 0.1:
            extra.append(picked[0])  # the same tensor twice
        if self.pythons and rng.random() < 0.3:
            extra.append(rng.choice(self.pythons))
        items = picked + extra
        shape = rng.random()
        if shape < 0.15 and len(items) == 1:
            return items[0]
        if shape < 0.25:
            return "[" + ", ".join(items) + "]"
        if shape < 0.35:
            return "{'out': " + items[0] + ", 'rest': (" + "".join(i + ", " for i in items[1:]) + ")}"
        return ", ".join(items) + ("," if len(items) == 1 else "")

    def finish(self) -> str:
        for _ in range(10):
            expr = self._return_expr()
            if self._try(f"__result__ = {expr}") is None:
                break
        else:
            expr = self.inputs[0]
        body = "\n".join("    " + line for stmt in self.body + self.tail for line in stmt.split("\n"))
        signature = ", ".join(self.inputs)
        return f"{self.header}\ndef f({signature}):\n{body}\n    return {expr}\n"


def generate(seed: int, device: str = "cpu") -> str:
    """The source of random program number `seed` (the same text for the same seed, on any machine); seeds
    from extended.EXTENDED_FROM up draw the extended program classes (modules, optimizers, autograd.Function,
    hooks, grad modes, autocast, layouts...)."""
    from tests.fuzz.extended import EXTENDED_FROM, ExtendedBuilder

    builder = (ExtendedBuilder if seed >= EXTENDED_FROM else Builder)(seed, device)
    rng = builder.rng
    for _ in range(rng.randint(2, 9)):
        builder.add_statement()
    if rng.random() < 0.06:
        builder.add_statement(keep_raising=True)
    return builder.finish()


if __name__ == "__main__":
    import sys
    for s in sys.argv[1:] or ["0"]:
        print(generate(int(s)))
