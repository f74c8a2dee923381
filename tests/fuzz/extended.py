"""The extended generator: seeds from EXTENDED_FROM up draw program classes the first generator does not.

Seeds below EXTENDED_FROM keep the programs they always named (CI's seeds and the regression seeds in
test_fuzz.py replay unchanged); a seed from EXTENDED_FROM up names a program of `ExtendedBuilder`, which
adds, on top of everything `Builder` draws:

- an `nn.Module` (MODEL) with parameters and buffers, some updated in place (running statistics), in
  train or eval mode (switched between calls), with forward hooks; optionally an optimizer (OPT) stepped
  between calls (`after_call`) or inside the compiled function after a `backward()`;
- torch.autograd.Function subclasses, tensor hooks, grad-mode nesting (no_grad, enable_grad,
  set_grad_enabled, inference_mode, decorators) with graph breaks inside, CPU bf16 autocast regions;
- integer and bool promotion with Python scalars, reductions over empty dim lists, closures whose cells
  are rebound;
- from LOOPS_FROM up, graph breaks inside loop bodies (LOOPS: `for` over a range, a list of tensors or a
  tensor's rows, `while`, nested loops, `break`/`continue` after the break, loops inside no_grad/autocast
  blocks and in called functions), drawn from a stream of their own in most programs; seeds below
  LOOPS_FROM name the programs they named before;
- inputs of size 0, rank 4, with inf / nan / -0.0 values, and laid out column-major, channels_last,
  expanded (stride 0) or at a storage offset;
- from SCALARS_FROM up, statements from a stream of their own (SCALARS): random draws, used or not (the
  program sets RNG: the harness seeds the global generator before each call and compares its state after),
  and scalars meeting bf16/fp16 tensors (0-d float32/float64/int64 tensors, Python numbers, floats computed
  from sizes, a complex tensor times one), whose results are compared bit for bit (`.view(torch.int16)`: a
  value one ulp off is a wrong value, not a rounding within tolerance);
- from OVERLAPS_FROM up, inputs whose elements share memory (expanded along the first or the last dim, rows that
  are overlapping windows) drawn from a stream of their own, and statements writing into them that eager allows
  whatever the overlap (OVERLAP_WRITES: empty slices, fills);
- from WRITTEN_OUTPUTS_FROM up, values a graph returns that the code after a graph break writes in place before the
  backward (WRITTEN_OUTPUTS: in grad mode, under no_grad, through `.data` or a detached view), beside values computed
  from them that eager's backward saves, or not (the graph's partition must save what the writes leave as eager's
  backward reads it), and inputs that are a leaf on some calls and a non-leaf on others (whether the caller may
  write an input is decided per call), drawn from a stream of their own;
- from NEGATED_FROM up, lazily negated tensors (`z.conj().imag`: a view whose memory holds the negated values):
  float inputs passed so, and statements making, reading and returning such views (NEGATED_VIEWS), drawn from a
  stream of their own.
"""
from __future__ import annotations

import random

import torch

from tests.fuzz.ops import FAMILIES, Op, broadcasts, has_dims, is_any, is_bool, is_float, is_int, is_num, ops
from tests.fuzz.programs import GPU_UNDEFINED, Builder, weighted

EXTENDED_FROM = 100_000
LOOPS_FROM = 100_500  # seeds from here up may draw LOOPS
LOOP_PROGRAMS = 0.7  # the share of those programs that draw LOOPS
LOOP_SHARE = 0.3     # in those, the share of statements drawn from LOOPS
SCALARS_FROM = 200_000  # seeds from here up draw SCALARS, from a stream of their own
SCALAR_SHARE = 0.3      # the share of their statements drawn from SCALARS
OVERLAPS_FROM = 300_000  # seeds from here up draw overlapping layouts and OVERLAP_WRITES, from a stream of their own
OVERLAP_SHARE = 0.2       # the share of their statements drawn from OVERLAP_WRITES, and of inputs laid out to overlap
WRITTEN_OUTPUTS_FROM = 400_000  # seeds from here up draw WRITTEN_OUTPUTS and LEAF_SOMETIMES, from a stream of their own
WRITTEN_SHARE = 0.3  # the share of their statements drawn from WRITTEN_OUTPUTS, and of their grad inputs LEAF_SOMETIMES
NEGATED_FROM = 600_000  # seeds from here up draw lazily negated inputs and NEGATED_VIEWS, from a stream of their own
NEGATED_SHARE = 0.15  # the share of their float inputs passed negated, and of their statements from NEGATED_VIEWS
DRAWN_FROM = 700_000  # seeds from here up draw DRAWN_BRANCHES, from a stream of their own
DRAWN_SHARE = 0.2  # the share of their statements drawn from DRAWN_BRANCHES
WIDTH = 3  # the model's feature width: inputs whose last dim is WIDTH feed it directly


def feeds_model(a) -> bool:
    return a.dtype == torch.float32 and a.dim() >= 1 and a.shape[-1] == WIDTH


def flattens_to_model(a) -> bool:
    return a.dim() >= 1 and a.numel() % WIDTH == 0


def float32_matmul(a, b) -> bool:
    return (a.dtype == b.dtype == torch.float32 and a.dim() >= 1 and b.dim() >= 1
            and a.shape[-1] == b.shape[-2 if b.dim() > 1 else 0])


MODULE_CALLS = [
    Op("MODEL({a})", feeds_model),
    Op("MODEL({a}.float().reshape(-1, 3))", flattens_to_model),
    Op("{out} = MODEL({a}) if MODEL.training else MODEL({a}).detach()", feeds_model, makes="block"),
    Op("MODEL.weight_of({a}) if hasattr(MODEL, 'weight_of') else {a} * 1", is_float),
]

TRAIN_STEP = [  # a whole training step inside the compiled function (backward() and the step break the graph)
    Op("{out} = MODEL({a}.float().reshape(-1, 3)).square().mean()\n{out}.backward()\nOPT.step()\n"
       "OPT.zero_grad()\n{out} = {out}.detach()", flattens_to_model, makes="block"),
]

GRAD_MODES = [
    Op("with torch.no_grad():\n    kiln.graph_break()\n    {out} = {a} * 2", is_num, makes="block"),
    Op("with torch.no_grad():\n    {out} = {a} * 2\n    with torch.enable_grad():\n        {out} = {out} + {a}",
       is_num, makes="block"),
    Op("with torch.set_grad_enabled(False):\n    {out} = {a} + 1\nwith torch.set_grad_enabled(True):\n"
       "    {out} = {out} * {a}", is_num, makes="block"),
    Op("with torch.inference_mode():\n    {out} = {a} * 3\n{out} = {out}.clone()", is_num, makes="block"),
    Op("with torch.inference_mode():\n    print('inference', torch.is_inference_mode_enabled(), file=BUF)\n"
       "    {out} = ({a} + 1).sum()", is_num, makes="block"),
    Op("torch.set_grad_enabled(False)\n{out} = {a} * 3\ntorch.set_grad_enabled(True)", is_num, makes="block"),
    Op("@torch.no_grad()\ndef helper(t):\n    return t * 2 + 1\n{out} = helper({a}) + {a}", is_num, makes="block"),
    Op("{a} * (2 if torch.is_grad_enabled() else 3)", is_num),
    Op("with torch.no_grad():\n    {p} = {a}.sum().item()\n    {out} = {a} * {p}", is_num, makes="block"),
    Op("with torch.enable_grad():\n    {out} = {a}.detach().requires_grad_() * 2", is_float, makes="block"),
    Op("with torch.no_grad():\n    {a}.mul_(2)", is_num, makes="none"),
]

AUTOCAST = [
    Op("with torch.autocast('cpu', dtype=torch.bfloat16):\n    {out} = {a} @ {b}", float32_matmul, 2, makes="block"),
    Op("with torch.autocast('cpu', dtype=torch.bfloat16):\n    {out} = torch.mm({a}, {a}.t()).relu() + 1",
       lambda a: a.dim() == 2 and a.dtype == torch.float32, makes="block"),
    Op("with torch.autocast('cpu', dtype=torch.bfloat16):\n    {out} = ({a} @ {b}).float().softmax(-1)",
       float32_matmul, 2, makes="block"),
    Op("with torch.autocast('cpu', dtype=torch.bfloat16):\n    {out} = {a} @ {b}\n"
       "    with torch.autocast('cpu', enabled=False):\n        {out} = {out}.float() + {a}.sum()",
       float32_matmul, 2, makes="block"),
    Op("with torch.autocast('cpu', dtype=torch.bfloat16):\n    kiln.graph_break()\n    {out} = {a} @ {b}",
       float32_matmul, 2, makes="block"),
]

AUTOGRAD = [  # autograd.Function subclasses and hooks
    Op("ScaledGrad.apply({a}, 3)", is_float),
    Op("SavedSquare.apply({a})", is_float),
    Op("{out} = SinCos.apply({a})[0] * 2", is_float, makes="block"),
    Op("{out}, sign = SinCos.apply({a})\n{out} = {out} + sign", is_float, makes="block"),
    Op("{out} = {a} * 2\nif {out}.requires_grad:\n    {out}.register_hook(lambda g: g * 3)", is_float,
       makes="block"),
    Op("{out} = {a} * 1.5\nif {out}.requires_grad:\n    {out}.register_hook(lambda g: LOG.append(tuple(g.shape)))",
       is_float, makes="block"),
    Op("if {a}.requires_grad and {a}.is_leaf:\n    {a}.register_hook(lambda g: g.clamp(-1, 1))", is_float,
       makes="none"),
    Op("{out} = {a}.detach() * 2", is_num, makes="block"),
]

PROMOTION = [  # integer and bool tensors with Python scalars, float edge values
    Op("{a} + 2.5", is_num), Op("{a} * True"), Op("{a} / 2"),
    Op("{a} - True", lambda a: not is_bool(a)), Op("True + {a}", is_num), Op("2 ** {a}", is_num),
    Op("{a} ** 2", is_num), Op("{a} // 2.5", is_num), Op("{a} % -3", is_num), Op("{a} + (1 << 40)", is_int),
    Op("{a} * float('inf')", is_num), Op("{a} + float('nan')", is_num), Op("{a} * -0.0", is_num),
    Op("{a}.float() + {a}", is_num), Op("{a}.clamp(min=0.5)", is_num), Op("{a} < 2.5", is_num),
    Op("torch.full_like({a}, -0.0, dtype=torch.float32) * {a}", is_num),
    Op("{a} & True", lambda a: is_int(a) or is_bool(a)), Op("{a} + {b}", broadcasts, 2),
    Op("torch.where({a} > 0, {a}, 0.5)", is_num), Op("torch.where({a} != 0, 1, {a})", is_num),
    Op("{a}.sum(dim=[])", is_num), Op("{a}.amax(dim=())", is_num), Op("{a}.sum({dim}, dtype=torch.float64)", has_dims),
    Op("{a}.mean(dim=[])", is_float), Op("torch.sign({a}) * {a}.signbit()", is_float),
    Op("{a}.isnan() | {a}.isinf()", is_float), Op("torch.copysign({a}.float(), -1.0)", is_num),
]

CLOSURES = [
    Op("SCALER({a})", is_num),
    Op("def add_k(t):\n    return t + {a}.shape[0] if {a}.dim() else t\n{out} = add_k({a})", is_num, makes="block"),
    Op("acc = []\ndef keep(t):\n    acc.append(t * 2)\nkeep({a})\nkeep({a} + 1)\n{out} = acc[0] + acc[-1]", is_num,
       makes="block"),
]

def square_float32(a) -> bool:
    return a.dtype == torch.float32 and a.dim() == 2


# Graph breaks inside loop bodies: kiln resumes these per iteration (a continuation's loop) or steps the frame
# natively (a frame with a `with` block), where loop-carried tensors, closures over the loop variable, lists
# grown across the break and in-place updates of carried values must come out as eager's.
LOOPS = [
    Op("{out} = {a}\nfor i in range({k} + 2):\n    {out} = {out} * 0.5 + i\n    kiln.graph_break()\n"
       "    {out} = {out} - 1", is_num, makes="block"),
    Op("{out} = {a} * 0\nfor t in [{a}, {b}, {a} + 1]:\n    if t.sum() > 0:\n        {out} = {out} + t\n"
       "    else:\n        {out} = {out} - t", broadcasts, 2, makes="block"),
    Op("{out} = {a}\ni = 0\nwhile i < {k} + 1:\n    {out} = {out} + i\n"
       "    print('step', i, tuple({out}.shape), file=BUF)\n    i += 1", is_num, makes="block"),
    Op("{out} = {a}\nfor i in range(3):\n    for j in range(2):\n        {out} = {out} * 2 - j\n"
       "        kiln.graph_break()\n        if i + j == 2:\n            break\n        {out} = {out} + i",
       is_num, makes="block"),
    Op("{out} = {a}\nfor i in range(4):\n    if i == 1:\n        continue\n    {out} = {out} + i\n"
       "    print('at', i, file=BUF)\n    if i == 2:\n        break\n    {out} = {out} * 2", is_num, makes="block"),
    Op("acc = []\nfor i in range({k} + 2):\n    acc.append({a} * i)\n    kiln.graph_break()\n"
       "    acc.append(acc[-1] + 1)\n{out} = torch.stack(acc).sum(0)", is_num, makes="block"),
    Op("{out} = {a}.clone()\nfor i in range(3):\n    {out}.mul_(0.5).add_(i)\n    print(i, file=BUF)\n"
       "    {out}[..., :1] += 1", lambda a: is_float(a) and a.dim() >= 1, makes="block"),
    Op("for i in range(2):\n    {a}.add_(i)\n    kiln.graph_break()", is_num, makes="none"),
    Op("fns = []\nfor i in range(3):\n    fns.append(lambda t, i=i: t * i)\n    kiln.graph_break()\n"
       "    fns.append(lambda t: t + i)\n{out} = sum(fn({a}) for fn in fns)", is_num, makes="block"),
    Op("{out} = {a}\nfor i, row in enumerate({a}):\n    if row.sum() > 0:\n        {out} = {out} + i\n"
       "    LOG.append(i)\n    if i >= 2:\n        break", has_dims, makes="block"),
    Op("{out} = {a}\ntotal = 0.0\nfor t in ({a}, {b}):\n    total = total + t.float().sum().item()\n"
       "    {out} = {out} * 2\n{out} = {out} + total", broadcasts, 2, makes="block"),
    Op("{out} = {a}\nsteps = 0\nwhile {out}.abs().sum() > 0.5 and steps < 4:\n    {out} = {out} * 0.5\n"
       "    steps += 1\nSTATE['steps'] = steps", is_float, makes="block"),
    Op("with torch.no_grad():\n    {out} = {a}\n    for i in range(2):\n        {out} = {out} * 2 + i\n"
       "        kiln.graph_break()\n        {out} = {out} - 1", is_num, makes="block"),
    Op("{out} = {a}\nfor i in range(2):\n    with torch.no_grad():\n        {out} = {out} * 2\n"
       "    print('no_grad', i, file=BUF)\n    {out} = {out} + {a}", is_num, makes="block"),
    Op("{out} = {a}\nfor i in range(2):\n    with torch.enable_grad():\n        kiln.graph_break()\n"
       "        {out} = {out} * 1.5\n    {out} = {out} + i", is_num, makes="block"),
    Op("with torch.autocast('cpu', dtype=torch.bfloat16):\n    {out} = {a}\n    for i in range(2):\n"
       "        {out} = ({out} @ {out}.t()).tanh()\n        kiln.graph_break()\n{out} = {out}.float()",
       square_float32, makes="block"),
    Op("def run_steps(t, steps):\n    for i in range(steps):\n        t = t + i\n        if t.sum() > 0:\n"
       "            t = t * 0.5\n    return t\n{out} = run_steps({a}, {k} + 2)", is_num, makes="block"),
    Op("def run_blocks(t):\n    out = []\n    for i in range(2):\n        with torch.no_grad():\n"
       "            u = t * i\n        print(end='', file=BUF)\n        out.append(u + t)\n    return out\n"
       "{out} = sum(run_blocks({a}))", is_num, makes="block"),
    Op("{out} = {a}\nfor t in [{a}, {b}]:\n    {p} = t.shape[0] if t.dim() else 1\n    kiln.graph_break()\n"
       "    {out} = {out} + {p}", broadcasts, 2, makes="block"),
    Op("{out} = {a}\nfor key, t in {{'x': {a}, 'y': {b}}}.items():\n    STATE[key] = STATE.get(key, 0) + 1\n"
       "    print(key, file=BUF)\n    {out} = {out} + t\n    if key == 'x' and {out}.sum() > 0:\n        break",
       broadcasts, 2, makes="block"),
    Op("{out} = {a}\ni = 0\nwhile True:\n    i += 1\n    {out} = {out} * 2\n    kiln.graph_break()\n"
       "    if i >= {k} + 1:\n        break", is_num, makes="block"),
    Op("def noisy(t, i):\n    print('noisy', i, file=BUF)\n    return t * 2 - i\n{out} = {a}\nfor i in range(3):\n"
       "    {out} = noisy({out}, i)", is_num, makes="block"),
    Op("{out} = {a}\nfor i in range(3):\n    STATE['loop'] = STATE.get('loop', 0) + i\n    kiln.graph_break()\n"
       "    {out} = {out} + STATE['loop']", is_num, makes="block"),
    Op("{out} = {a} * 1\nfor i, t in zip(range(2), reversed([{a}, {b}])):\n    {out} = {out} + t * i\n"
       "    LOG.append(tuple({out}.shape))\n    kiln.graph_break()", broadcasts, 2, makes="block"),
    Op("{out} = torch.stack([row * row.float().sum().item() for row in {a}])", has_dims, makes="block"),
    Op("{out} = {a}\nfor i in range(2):\n    def bump(t):\n        return t + {out}.mean()\n"
       "    kiln.graph_break()\n    {out} = bump({out})", is_float, makes="block"),
    Op("{out} = {a}\nfor i in range(int({a}.abs().sum().item()) % 3 + 1):\n    {out} = {out} - i", is_num,
       makes="block"),
    Op("acc = [{a}]\nfor i in range(3):\n    acc.insert(0, acc[-1] * 2)\n    print(len(acc), file=BUF)\n"
       "    if len(acc) > 2:\n        acc.pop()\n{out} = acc[0] + acc[-1]", is_num, makes="block"),
    Op("for i in range(2):\n    with torch.no_grad():\n        {a}.sub_({a} * 0.25)\n    print('step', i, file=BUF)",
       is_float, makes="none"),
]

def ops_making(where, makes: str, *codes: str) -> list[Op]:
    """One-operand templates over operands satisfying `where`, each binding what `makes` says (see Op)."""
    return ops(where, 1, *codes, makes=makes)


RANDOM_DRAWS = (  # each moves the global generator, whether its value is used or not
    ops_making(is_any, "none", "torch.rand(3)", "torch.randn(2, 3)", "torch.randint(0, 7, (4,))",
               "torch.rand_like({a}.float())", "torch.empty(5).uniform_(-1, 1)", "torch.empty(4).exponential_()",
               "torch.empty(6).random_(100)", "torch.empty(2, 3).t().random_(-3, 100)", "torch.randperm(6)",
               "torch.multinomial(torch.ones(5), 2)", "torch.bernoulli(torch.full((4,), 0.5))",
               "torch.empty(3).normal_()")
    + ops_making(is_num, "tensor", "{a} * torch.rand_like({a}.float())",
                 "torch.bernoulli(torch.full_like({a}.float(), 0.3)) * {a}",
                 "{a}.float() + torch.randint(0, 3, {a}.shape)", "torch.normal({a}.float().detach(), 1.0)")
    + ops_making(is_float, "tensor", "torch.nn.functional.dropout({a}, 0.5, training=True)",
                 "{a} + torch.randn({a}.shape, dtype={a}.dtype)")
    + ops_making(has_dims, "tensor", "torch.randperm({a}.shape[0]).float()")
)

# a bf16/fp16 result as its bits: one ulp off is a wrong value. (No `alpha`: eager's scalar loop, which takes a
# tail shorter than a vector, rounds alpha * b to the half type where its vectorized loop does not.)
NARROW_SCALARS = (
    ops_making(is_num, "tensor", "({a}.to(torch.bfloat16) * torch.tensor(0.1)).view(torch.int16)",
               "({a}.half() / torch.tensor(3.0, dtype=torch.float64)).view(torch.int16)",
               "({a}.half() + 0.1).view(torch.int16)", "(torch.tensor(0.3) - {a}.to(torch.bfloat16)).view(torch.int16)",
               "({a}.to(torch.bfloat16) * torch.tensor(2049)).view(torch.int16)", "{a}.half() > 0.1",
               "{a}.to(torch.bfloat16) == torch.tensor(0.1)", "({a}.half() ** 0.3).view(torch.int16)",
               "torch.lerp({a}.half(), {a}.half() * 2, torch.tensor(0.3)).view(torch.int16)",
               "torch.addcmul({a}.to(torch.bfloat16), {a}.to(torch.bfloat16), torch.tensor(0.1)).view(torch.int16)",
               "torch.div({a}.to(torch.bfloat16), 0.3, rounding_mode='floor').view(torch.int16)")
    + ops_making(has_dims, "tensor", "({a}.to(torch.bfloat16) * math.sqrt({a}.shape[-1])).view(torch.int16)",
               "({a}.half() / math.sqrt({a}.shape[0])).view(torch.int16)",
               "({a}.half() + {a}.shape[0] / 3).view(torch.int16)",
               "({a}.to(torch.complex64) * math.sqrt({a}.shape[-1])).real",
               "torch.full({a}.shape, {a}.shape[0] / 3, dtype=torch.bfloat16).view(torch.int16)",
               "{a}[:round({a}.shape[0] / 2)]", "{a}.float() * ({a}.shape[0] / 7)")
)
SCALARS = RANDOM_DRAWS + NARROW_SCALARS

# writes eager allows into a tensor whose elements share memory: an empty region, and fills (any other in-place op
# raises there, or writes overlapping windows in its kernel's order)
OVERLAP_WRITES = (
    ops_making(has_dims, "none", "{a}[..., {a}.shape[-1]:] = 0", "{a}[:0].add_(1)", "{a}[0].zero_()",
               "torch.nn.init.zeros_({a}[..., :1])", "{a}[..., 1:].fill_(2)")
    + ops_making(is_num, "none", "{a}.fill_(1)", "{a}.zero_()")
)
OVERLAPPING_LAYOUTS = ["expand", "expand_last", "windows"]

# a lazily negated view of a float value ({out} holds {a}'s values, negated in memory), then read or returned as is
NEGATED_VIEWS = ops(is_float, 1, "torch.view_as_complex(torch.stack([{a}, -{a}], -1).contiguous()).conj().imag",
                    "torch.view_as_complex(torch.stack([{a}, {a} * 0.5], -1).contiguous()).conj().imag * 2",
                    "(-{a})._neg_view()", "(-{a})._neg_view().exp()")

# branches on a uniform draw compared with a number, inside [0, 1] or outside it (kiln decides those at capture:
# kiln/capture/value_bounds.py), a number that changes between calls (Obj.scale), NaN, several elements (ambiguous)
_DRAW_COMPARED = [f"{draw} {cmp} {c}" for draw in ("torch.rand([])",) for cmp in ("<", "<=", ">", ">=")
                  for c in ("0.0", "-1", "1.0", "1.5", "0.5", "Obj.scale", "float('nan')")]
DRAWN_BRANCHES = (
    [Op("{out} = {a}\nif " + test + ":\n    {out} = {out} * 2\nelse:\n    {out} = {out} - 1", is_num, makes="block")
     for test in _DRAW_COMPARED]
    + [Op("{out} = {a}\nif " + c + " " + cmp + " torch.rand([]):\n    {out} = {out} + 1", is_num, makes="block")
       for cmp in ("<", ">=") for c in ("0.0", "1.5", "Obj.scale")]
    + ops_making(is_num, "block",
                 "{out} = {a}\nif bool(torch.rand_like({a}.float().reshape(-1)[:1]) < 0.0):\n    {out} = {out} * 0",
                 "{out} = {a}\nfor i in range(3):\n    if torch.rand([]) < (0.0 if i else Obj.scale):\n"
                 "        continue\n    {out} = {out} * 1.5 + i",
                 "{out} = {a}\nif torch.rand(2) < 0.0:\n    {out} = {out} * 3")
)

# a value the graph returns to the code after a break ({out}), beside a value computed from it ({p}): eager's backward
# saves {out} (sin, a product with itself), or only what it computed from it (exp, sigmoid, tanh)
SAVED_BESIDE = ("{out}.exp() * {out}.sigmoid()", "{out}.sin()", "{out}.tanh() * 2", "{out} * {out}",
                "torch.relu({out}) + {out}.exp()", "({out} * 3).exp()")
# writes into it before the backward, each of which eager allows on a non-leaf
WRITES = ("{out}.mul_(2)", "with torch.no_grad():\n    {out}.mul_(2)", "{out}.data.mul_(2)",
          "{out}.detach()[..., :1].zero_()", "{out}[..., :1].add_(1)")
WRITTEN_OUTPUTS = [Op("{out} = {a} * 1.5 + 0.5\n{p} = " + saved + "\nkiln.graph_break()\n" + write
                      + "\n{out} = {out} + {p}", is_float, makes="block")
                   for saved in SAVED_BESIDE for write in WRITES] + [
    Op("{out} = ({a} * 2).exp() * 3\nkiln.graph_break()\n{a}.add_(1)", is_float, makes="block"),  # an input
    Op("{out} = {a} @ {a}.mT\n{p} = {out}.exp() * {out}.sigmoid()\nkiln.graph_break()\n{out}.mul_(2)\n"
       "{out} = {out} + {p}", lambda a: is_float(a) and a.dim() >= 2, makes="block"),
]
# an input requiring grad that is a leaf on even calls and a non-leaf (an activation) on odd ones
LEAF_SOMETIMES = "(lambda t: t * 1 if call % 2 else t)({})"

EXTENDED_FAMILIES: list[tuple[str, list[Op], float]] = [
    ("grad_mode", GRAD_MODES, 1.5), ("autocast", AUTOCAST, 1), ("autograd", AUTOGRAD, 1.5),
    ("promotion", PROMOTION, 2), ("closure", CLOSURES, 0.7),
]

MODELS = {
    "stats": '''class Model(torch.nn.Module):
    """a linear map with running statistics updated in place in training mode, like BatchNorm's"""
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed({seed})
        self.weight = torch.nn.Parameter(torch.randn(3, 3, generator=g) * 0.5)
        self.bias = torch.nn.Parameter(torch.randn(3, generator=g) * 0.1)
        self.register_buffer("running", torch.zeros(3))
        self.register_buffer("calls", torch.tensor(0))

    def forward(self, x):
        y = x @ self.weight + self.bias
        if self.training:
            self.running.mul_(0.9).add_(y.detach().reshape(-1, 3).mean(0), alpha=0.1)
            self.calls += 1
        return y - self.running

    def weight_of(self, t):
        return t * self.weight.sum() + self.running.mean()

MODEL = Model()''',
    "layers": '''torch.manual_seed({seed})
MODEL = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.ReLU(), torch.nn.Linear(4, 3))''',
    "batchnorm": '''torch.manual_seed({seed})
MODEL = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False), torch.nn.BatchNorm1d(3), torch.nn.Tanh())''',
}
HOOKS = ["MODEL.register_forward_hook(lambda module, args, out: out * 2)",
         "MODEL.register_forward_pre_hook(lambda module, args: (args[0] + 1,))",
         "MODEL.register_forward_hook(lambda module, args, out: LOG.append(tuple(out.shape)))"]
OPTIMIZERS = ["torch.optim.SGD(MODEL.parameters(), lr=0.1)",
              "torch.optim.SGD(MODEL.parameters(), lr=0.05, momentum=0.9)",
              "torch.optim.Adam(MODEL.parameters(), lr=0.01, eps=1e-3)",
              "torch.optim.AdamW(MODEL.parameters(), lr=0.01, eps=1e-3, weight_decay=0.1)"]
# Adam divides by the gradient's running magnitude: with its default eps, a gradient that is zero but for
# rounding (a bias before a normalization) takes a full step whose sign is the rounding's; eps=1e-3 keeps
# such steps as small as the rounding while real gradients step as usual.


class ExtendedBuilder(Builder):
    """Builder with the extended classes: its own random stream decides them, so the base draws stay readable."""

    def __init__(self, seed: int, device: str = "cpu"):
        self.model_lines = self._draw_model(seed)
        # Loops with breaks come from a stream of their own, from LOOPS_FROM up: the seeds below it name the
        # programs they named before loops were added (CI's and the regression seeds among them).
        self.loop_rng = random.Random(f"kiln-fuzz-loops-{seed}")
        self.loop_share = LOOP_SHARE if seed >= LOOPS_FROM and self.loop_rng.random() < LOOP_PROGRAMS else 0.0
        # SCALARS likewise, from SCALARS_FROM up
        self.scalar_rng = random.Random(f"kiln-fuzz-scalars-{seed}")
        self.scalar_share = SCALAR_SHARE if seed >= SCALARS_FROM else 0.0
        # OVERLAPPING_LAYOUTS and OVERLAP_WRITES likewise, from OVERLAPS_FROM up
        self.overlap_rng = random.Random(f"kiln-fuzz-overlaps-{seed}")
        self.overlap_share = OVERLAP_SHARE if seed >= OVERLAPS_FROM else 0.0
        # WRITTEN_OUTPUTS and LEAF_SOMETIMES likewise, from WRITTEN_OUTPUTS_FROM up
        self.written_rng = random.Random(f"kiln-fuzz-written-outputs-{seed}")
        self.written_share = WRITTEN_SHARE if seed >= WRITTEN_OUTPUTS_FROM else 0.0
        # negated inputs and NEGATED_VIEWS likewise, from NEGATED_FROM up
        self.negated_rng = random.Random(f"kiln-fuzz-negated-{seed}")
        self.negated_share = NEGATED_SHARE if seed >= NEGATED_FROM else 0.0
        # DRAWN_BRANCHES likewise, from DRAWN_FROM up
        self.drawn_rng = random.Random(f"kiln-fuzz-drawn-{seed}")
        self.drawn_share = DRAWN_SHARE if seed >= DRAWN_FROM else 0.0
        super().__init__(seed, device)

    def _draw_model(self, seed: int) -> list[str]:
        rng = random.Random(f"kiln-fuzz-model-{seed}")
        if rng.random() < 0.4:
            self.has_model = self.has_optimizer = False
            return []
        kind = rng.choice(sorted(MODELS))
        lines = MODELS[kind].format(seed=seed % 100000).split("\n")
        if rng.random() < 0.3:
            lines.append("MODEL.eval()")
        if rng.random() < 0.3:
            lines.append(rng.choice(HOOKS))
        self.has_model = True
        self.has_optimizer = rng.random() < 0.6
        if self.has_optimizer:
            lines.append(f"OPT = {rng.choice(OPTIMIZERS)}")
            step = rng.choice(["    OPT.step()\n    OPT.zero_grad()", "    if call % 2:\n        OPT.step()\n"
                               "        OPT.zero_grad()", "    OPT.step()"])
            lines += ["", "def after_call(call):", step]
        if rng.random() < 0.25:
            lines += ["", "def before_call(call):", "    MODEL.train(call % 2 == 0)"]
        return lines + [""]

    # -- inputs ------------------------------------------------------------------------------
    def _shape(self) -> str:
        rng = self.rng
        if rng.random() < 0.1:
            return "(" + ", ".join(rng.choice(["n", "2", "3"]) for _ in range(4)) + ")"
        shape = super()._shape()
        if rng.random() < 0.12 and shape not in ("()",) and not shape.startswith("["):
            dims = shape.strip("(),").split(", ")
            dims[rng.randrange(len(dims))] = "0"
            return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
        return shape

    def _input_line(self, name: str, earlier: list[str]) -> str:
        rng = self.rng
        if self.has_model and not earlier and rng.random() < 0.6:  # the model takes the first input as it is
            grad = ", grad=True" if not self.no_grad and rng.random() < 0.5 else ""
            return f"{name} = randn(g, (n, {WIDTH}), torch.float32{grad})"
        line = super()._input_line(name, earlier)
        if "(g," not in line:  # an alias of an earlier input
            return line
        extra = []
        if line.startswith(f"{name} = randn") and rng.random() < 0.3:
            extra.append("edges=True")
        if rng.random() < 0.35:
            extra.append(f"layout={rng.choice(['t', 'channels_last', 'expand', 'offset'])!r}")
        if self.overlap_share and self.overlap_rng.random() < self.overlap_share:
            extra = [e for e in extra if not e.startswith("layout=")]
            extra.append(f"layout={self.overlap_rng.choice(OVERLAPPING_LAYOUTS)!r}")
        if self.negated_share and line.startswith(f"{name} = randn") and self.negated_rng.random() < self.negated_share:
            extra = [e for e in extra if not e.startswith("layout=")] + ["layout='negated'"]
        line = line[:-1] + "".join(", " + e for e in extra) + ")" if extra else line
        if self.written_share and line.startswith(f"{name} = randn") and not self.no_grad and "grad=True" not in line \
                and self.written_rng.random() < 0.5:  # values written before a backward matter where there is one
            line = line[:-1] + ", grad=True)"
        if "grad=True" in line and self.written_share and self.written_rng.random() < self.written_share:
            value = line.split(" = ", 1)[1]
            line = f"{name} = {LEAF_SOMETIMES.format(value)}"
        return line

    def _header(self) -> str:
        header = super()._header()
        if self.scalar_share:  # the harness seeds the global generator before each call and compares it after
            header = header.replace("\nNO_GRAD = ", "\nRNG = True\nNO_GRAD = ", 1)
        if not self.model_lines:
            return header
        model = "\n".join(self.model_lines) + "\n"
        if "def before_call" in header and "def before_call" in model:  # one before_call doing both
            model = model.replace("def before_call(call):\n", "def model_mode(call):\n")
            header = header.replace("def before_call(call):\n", "def before_call(call):\n    model_mode(call)\n")
        at = header.index("def inputs")
        return header[:at] + model + "\n" + header[at:]

    # -- statements --------------------------------------------------------------------------
    def _pick_op(self) -> Op:
        if self.drawn_share and self.drawn_rng.random() < self.drawn_share:
            return self.drawn_rng.choice(DRAWN_BRANCHES)
        if self.negated_share and self.negated_rng.random() < self.negated_share:
            return self.negated_rng.choice(NEGATED_VIEWS)
        if self.written_share and self.written_rng.random() < self.written_share:
            return self.written_rng.choice(WRITTEN_OUTPUTS)
        if self.overlap_share and self.overlap_rng.random() < self.overlap_share:
            return self.overlap_rng.choice(OVERLAP_WRITES)
        if self.loop_share and self.loop_rng.random() < self.loop_share:
            return self.loop_rng.choice(LOOPS)
        if self.scalar_share and self.scalar_rng.random() < self.scalar_share:
            return self.scalar_rng.choice(SCALARS)
        families = [(ops, w) for _, ops, w in FAMILIES + EXTENDED_FAMILIES]
        if self.has_model:
            families.append((MODULE_CALLS, 4))
            if self.has_optimizer:
                families.append((TRAIN_STEP, 0.5))
        op = self.rng.choice(weighted(self.rng, families))
        return op if self.device == "cpu" or op.code not in GPU_UNDEFINED else self._pick_op()


def ops_making(where, makes: str, *codes: str) -> list[Op]:
    return [Op(c, where, makes=makes) for c in codes]


__all__ = ["EXTENDED_FROM", "ExtendedBuilder", "EXTENDED_FAMILIES"]
