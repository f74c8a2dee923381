"""Failures the fuzzer found, minimized (`python -m tests.fuzz --minimize SEED`), one named test per bug class.

Each program is the minimizer's output, pasted as it printed it (the seed it came from is in its first
line); `check_program` runs it eagerly and compiled and asserts kiln agrees on values, gradients, Python
state, exceptions, output identity and aliasing, and requires_grad. Each test runs on the backends
where the failure was seen: "eager" when capture is at fault, "aot_eager" when the AOT autograd stage
is, "inductor" when code generation is.
"""
from __future__ import annotations

import pytest

from tests.fuzz.compare import check_program


def backends(*names):
    return pytest.mark.parametrize("backend", names)


# -- issue 21 class 1: a size symbol bound only inside call() -------------------------------------------------
@backends("eager", "inductor")
def test_no_grad_matmul_after_a_size_change(backend):
    check_program('''
# kiln fuzz program, minimized from seed 210, backend eager
CALLS = 2
DYNAMIC = None
NO_GRAD = True

def inputs(call):
    g = torch.Generator().manual_seed(210 * 10 + call)
    n, m = ((2, 5, 3)[call], (2, 4, 3)[call])
    a = randn(g, (n, n), torch.float32)
    return [a]

def f(a):
    p0 = len(a)
    t4 = a.t() @ a
    t7 = t4 * p0
    return None
''', backend)


# -- issue 21 class 2: outputs that alias each other or are detached ----------------------------------------------
@backends("aot_eager", "inductor")
def test_detached_output_does_not_require_grad(backend):
    check_program('''
# kiln fuzz program, minimized from seed 74, backend inductor
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(74 * 10 + call)
    b = randn(g, (1,), torch.float32, grad=True)
    return [b]

def f(b):
    t1 = torch.maximum(b, b)
    return [t1, t1.detach()]
''', backend)


@backends("aot_eager", "inductor")
def test_detached_contiguous_view_of_an_input(backend):
    check_program('''
# kiln fuzz program, minimized from seed 71, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(71 * 10 + call)
    a = randn(g, (1, 4), torch.float64, grad=True)
    return [a]

def f(a):
    t0 = a.flatten()
    t3 = t0.contiguous()
    return (t3.detach(),)
''', backend)


@backends("inductor")
def test_sliced_output_and_its_detached_alias(backend):
    check_program('''
# kiln fuzz program, minimized from seed 122, backend inductor
CALLS = 1
DYNAMIC = False
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(122 * 10 + call)
    n, m = ((3, 6, 4)[call], (2, 4, 3)[call])
    b = randn(g, (m, n), torch.bfloat16)
    return [b]

def f(b):
    t0 = b - 7
    t2 = t0[..., 1:]
    return (t2, t2.detach())
''', backend)


@backends("aot_eager", "inductor")
def test_expanded_view_of_an_offset_input(backend):
    check_program('''
# kiln fuzz program, minimized from seed 58, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(58 * 10 + call)
    a = ints(g, (3,), torch.int32, edges=True)
    c = a[1:]
    return [c]

def f(c):
    t0 = c.unsqueeze(0).expand(2, *c.shape)
    t4 = t0.squeeze()
    return (t4[1:],)
''', backend)


# -- issue 21 class 4: class attributes read and written -------------------------------------------------------
@backends("eager")
def test_class_attribute_increment_runs_every_call(backend):
    check_program('''
# kiln fuzz program, minimized from seed 137, backend eager
CALLS = 2
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(137 * 10 + call)
    n, m = ((3, 5, 4)[call], (3, 3, 1)[call])
    c = randn(g, (n,), torch.float32)
    return [c]

def f(c):
    t0 = torch.sigmoid(c)
    t3 = c.sum()
    t5 = torch.where(t0 > t3, t0, t3)
    Obj.count += 1
    return ((t5,),)
''', backend)


@backends("eager")
def test_class_attribute_changed_between_calls(backend):
    check_program('''
# kiln fuzz program, minimized from seed 200, backend eager
CALLS = 2
DYNAMIC = None
NO_GRAD = False

def before_call(call):
    Obj.scale = (-1.0, 2.0, 2.0)[call]

def inputs(call):
    g = torch.Generator().manual_seed(200 * 10 + call)
    c = randn(g, (4, 1), torch.float32)
    return [c]

def f(c):
    t0 = c * Obj.scale
    return (t0,)
''', backend)


# -- issue 21 class 5: SymInts leaking into user state --------------------------------------------------------
@backends("eager")
def test_attribute_set_from_a_size_after_it_changed(backend):
    check_program('''
# kiln fuzz program, minimized from seed 266, backend eager
CALLS = 2
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(266 * 10 + call)
    n, m = ((6, 2, 5)[call], (3, 1, 1)[call])
    a = randn(g, (n, n, n), torch.float32)
    return [a]

def f(a):
    parts = torch.split(a, 1, dim=-1)
    OBJ.total = getattr(OBJ, 'total', 0) + a.shape[0]
    return None
''', backend)


# -- issue 21 class 6: values eager rejects ----------------------------------------------------------------------
@backends("inductor")
def test_integer_floor_division_by_zero_raises(backend):
    check_program('''
# kiln fuzz program, minimized from seed 239, backend inductor
CALLS = 1
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(239 * 10 + call)
    a = randn(g, (3,), torch.float32)
    return [a]

def f(a):
    t0 = torch.nan_to_num(a).clamp(-1000, 1000).to(torch.int64)
    t3 = t0 // t0
    return None
''', backend)


# -- issue 21 class 7: data-dependent sizes -----------------------------------------------------------------------
@backends("eager", "aot_eager")
def test_length_of_a_masked_tensor(backend):
    check_program('''
# kiln fuzz program, minimized from seed 235, backend eager
CALLS = 1
DYNAMIC = None
NO_GRAD = True

def inputs(call):
    g = torch.Generator().manual_seed(235 * 10 + call)
    n, m = ((7, 6, 2)[call], (3, 2, 2)[call])
    a = randn(g, (m,), torch.float32)
    return [a]

def f(a):
    t0 = a.abs_()
    p2 = len(t0[t0 > 0])
    return (p2,)
''', backend)


@backends("aot_eager")
def test_nonzero_of_a_dynamic_shape(backend):
    check_program('''
# kiln fuzz program, minimized from seed 154, backend aot_eager
CALLS = 1
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(154 * 10 + call)
    n, m = ((5, 7, 3)[call], (1, 2, 1)[call])
    d = ints(g, (n, 3), torch.int64, edges=True)
    return [d]

def f(d):
    t0 = d - -5
    t1 = t0 % t0
    t2 = t1.reshape(t1.shape[0], -1)
    t3 = t2.nonzero()
    return None
''', backend)


# -- new: a reduction over dimensions of size 1 returns storage of its input ------------------------------------
@backends("inductor")
def test_product_over_a_size_one_dim_is_a_new_tensor(backend):
    check_program('''
# kiln fuzz program, minimized from seed 262, backend inductor
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(262 * 10 + call)
    a = randn(g, (1,), torch.float32)
    return [a]

def f(a):
    t2 = a.prod(0)
    return (t2,)
''', backend)


@backends("inductor")
def test_sum_of_a_one_element_view_is_a_new_tensor(backend):
    check_program('''
# kiln fuzz program, minimized from seed 3, backend inductor
CALLS = 1
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(3 * 10 + call)
    a = randn(g, (1, 1), torch.float32)
    c = a[::2]
    return [c]

def f(c):
    t0 = c.reshape(c.shape[0], -1)
    t6 = t0.sum()
    return (t6,)
''', backend)


@backends("inductor")
def test_max_over_a_size_one_dim_does_not_alias_another_output(backend):
    check_program('''
# kiln fuzz program, minimized from seed 220, backend inductor
CALLS = 3
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(220 * 10 + call)
    a = randn(g, [(1,), (1,), (2, 1)][call], torch.float32)
    b = a.flip(0) if a.dim() else a
    return [b]

def f(b):
    t0 = torch.clamp(b, -0.5, 0.5)
    t1 = torch.stack([t0, t0 + 1])
    t2 = t1 + 1
    t3 = t2[1:, 1:]
    t4 = t3.amax(0)
    return [t4, t3]
''', backend)


# -- new: ops that return their input itself in eager ----------------------------------------------------------
@backends("aot_eager", "inductor")
def test_long_of_a_long_tensor_is_the_tensor_itself(backend):
    check_program('''
# kiln fuzz program, minimized from seed 23, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = True

def inputs(call):
    g = torch.Generator().manual_seed(23 * 10 + call)
    n, m = ((2, 7, 4)[call], (1, 1, 4)[call])
    c = ints(g, (4, n), torch.int64, edges=True)
    return [c]

def f(c):
    t2 = c.view(c.shape)
    t4 = t2.long()
    return [t4, t2]
''', backend)


# -- new: in-place ops that change metadata (t_, unsqueeze_) --------------------------------------------------
@backends("aot_eager", "inductor")
def test_in_place_transpose_of_an_input(backend):
    check_program('''
# kiln fuzz program, minimized from seed 108, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(108 * 10 + call)
    n, m = ((7, 2, 5)[call], (4, 1, 3)[call])
    b = ints(g, (n, 3), torch.int64, edges=True)
    return [b]

def f(b):
    t4 = b.t_() if b.dim() == 2 else b.unsqueeze_(0)
    return None
''', backend)


# -- new: in-place ops eager rejects (result dtype) ---------------------------------------------------------------
@backends("aot_eager", "inductor")
def test_in_place_multiply_of_a_bool_view_raises(backend):
    check_program('''
# kiln fuzz program, minimized from seed 77, backend aot_eager
CALLS = 1
DYNAMIC = False
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(77 * 10 + call)
    n, m = ((4, 3, 6)[call], (3, 2, 4)[call])
    a = bools(g, (3, n))
    b = randn(g, (1,), torch.float32)
    return [a, b]

def f(a, b):
    t2 = a.any(0)
    t3 = t2 < b
    t5 = t3[..., 1:].mul_(2)
    return None
''', backend)


# -- new: an in-place op on a value autograd saved (eager raises only in backward) ------------------------------
@backends("aot_eager")
def test_in_place_on_a_value_saved_for_backward(backend):
    check_program('''
# kiln fuzz program, minimized from seed 18, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(18 * 10 + call)
    n, m = ((2, 5, 4)[call], (3, 3, 1)[call])
    d = randn(g, (m, n), torch.float32, grad=True)
    return [d]

def f(d):
    t3 = d.reciprocal()
    t4 = t3.abs_()
    return (t4,)
''', backend)


# -- issue 21 class 10: an input the loss does not reach keeps .grad None --------------------------------------
@backends("aot_eager", "inductor")
def test_input_outside_the_loss_keeps_grad_none(backend):
    # the harness's loss leaves out the last output on odd calls: b reaches only that output
    check_program('''
CALLS = 2
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1)
    return [randn(g, (3,), grad=True), randn(g, (3,), grad=True)]

def f(a, b):
    return a * 3, b * 2
''', backend)


# -- issue 21 class 6: a bool tensor minus a number (eager rejects it; seed 169, minimized by hand) --------------
@backends("inductor")
def test_subtraction_from_a_bool_tensor_raises(backend):
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1)
    return [bools(g, (4, 3))]

def f(a):
    return a - 1
''', backend)


# -- new: a write through an expanded view (overlapping memory, eager rejects it; seed 217, by hand) -----------
@backends("aot_eager", "inductor")
def test_write_into_an_expanded_view_raises(backend):
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1)
    return [randn(g, (4,))]

def f(d):
    t0 = d.unsqueeze(-1).expand(*d.shape, 3)
    t0[:-1] = 0
    return d
''', backend)


# -- new: the clone of a view of an input is returned as a view of the input (seeds 28, 10; by hand) ------------
@backends("inductor")
def test_clone_of_an_input_view_is_a_new_tensor(backend):
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1)
    return [ints(g, (4,), torch.int32)]

def f(b):
    t0 = b.unflatten(0, (b.shape[0], 1))
    t3 = t0.clone()
    return t3.transpose(0, -1)
''', backend)


# -- issue 21 class 2: a view of an input that has a storage offset ------------------------------------------------
@backends("aot_eager", "inductor")
def test_movedim_of_an_offset_input_view(backend):
    check_program('''
# kiln fuzz program, minimized from seed 317, backend aot_eager
CALLS = 1
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(317 * 10 + call)
    a = randn(g, (3,), torch.float32)
    c = a[1:]
    return [c]

def f(c):
    t1 = c.movedim(0, -1)
    return (t1,)
''', backend)


# -- issue 21 class 3: after a graph break, an input and a view of it are two inputs of the next graph --------------
@backends("inductor")
def test_view_of_an_input_sees_its_mutation_after_a_graph_break(backend):
    check_program('''
# kiln fuzz program, minimized from seed 257, backend inductor
CALLS = 1
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(257 * 10 + call)
    n, m = ((5, 2, 4)[call], (3, 2, 2)[call])
    a = randn(g, (m, 3), torch.float32)
    return [a]

def f(a):
    t0 = a.view(-1)
    t2 = t0.transpose(0, -1)
    t4 = t2.float() * float(t2.float().mean())
    a.sin_()
    t6 = t2.lerp(t2.to(t2.dtype), 0.3)
    return (t6,)
''', backend)


# -- Python side effects made before an op that raises are kept (the frame re-runs eagerly: kiln.capture.rerun) -------
@backends("eager", "aot_eager", "inductor")
def test_append_before_a_division_by_zero_is_kept(backend):
    check_program('''
# kiln fuzz program, minimized from seed 395, backend eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(395 * 10 + call)
    n, m = ((4, 2, 3)[call], (2, 4, 2)[call])
    a = ints(g, (3,), torch.int32, edges=True)
    return [a]

def f(a):
    t0 = a.cumsum(-1)
    LOG.append(t0.dim())
    t2 = torch.stack([t0, t0 + 1])
    t3 = t2 * 2
    t4 = t0 % t3
    return None
''', backend)


# -- issue 21 class 10: an input used only by a value that is not returned, before a graph break ---------------
@backends("aot_eager", "inductor")
def test_input_used_only_before_a_graph_break_keeps_grad_none(backend):
    check_program('''
# kiln fuzz program, minimized from seed 383, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(383 * 10 + call)
    n, m = ((6, 5, 3)[call], (3, 1, 2)[call])
    b = randn(g, (3, 2), torch.float64, grad=True)
    c = randn(g, (1,), torch.float32, grad=True)
    return [b, c]

def f(b, c):
    t1 = b.transpose(0, -1)
    t3 = torch.softmax(t1, -1)
    t4 = torch.log(t3.abs() + 1)
    t5 = c.prod(-1)
    print(tuple(t4.shape), t4.dtype, file=BUF)
    return [t4]
''', backend)


# -- new: bool + bool in generated code is not a bool (True + True gives 2) ------------------------------------------
@backends("inductor")
def test_sum_of_bool_slices_stays_bool(backend):
    check_program('''
# kiln fuzz program, minimized from seed 313, backend inductor
CALLS = 2
DYNAMIC = None
NO_GRAD = True

def inputs(call):
    g = torch.Generator().manual_seed(313 * 10 + call)
    n, m = ((3, 5, 6)[call], (2, 3, 3)[call])
    a = bools(g, (n,))
    return [a]

def f(a):
    parts = torch.split(a, 1, dim=0)
    t0 = sum(parts[1:], parts[0])
    t1 = a / t0
    t3 = t1.exp()
    return (t3,)
''', backend)


# -- issue 21 class 2: a view mutated in place, returned with its base: the base's gradient is lost ------------------
@backends("aot_eager", "inductor")
def test_gradient_through_a_mutated_view_returned_with_its_base(backend):
    # seed 362 (bf16), minimized by hand; float32 fails the same way
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1)
    return [randn(g, (6,), torch.float32, grad=True)]

def f(d):
    t1 = d - 3
    t2 = t1[::3].mul_(2)
    return t2, t1
''', backend)


# -- issue 21 class 3: `a.float()` is `a`; after a graph break both are inputs of the next graph ---------------------
@backends("aot_eager", "inductor")
def test_in_place_on_a_self_returning_conversion_after_a_graph_break(backend):
    # seed 409, minimized by hand
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1)
    return [randn(g, (3,), torch.float32)]

def f(a):
    t0 = a.float()
    print(a.shape, file=BUF)
    t0.sin_()
    return a * 2
''', backend)


# -- new: an output the loss skips gets a zero tangent; its backward (sqrt at 0) made 0 * inf = NaN --------------
@backends("aot_eager", "inductor")
def test_unreached_output_backward_makes_no_nan(backend):
    check_program('''
# kiln fuzz program, minimized from seed 7, backend aot_eager
CALLS = 2
DYNAMIC = False
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(7 * 10 + call)
    n, m = ((3, 5, 2)[call], (2, 2, 4)[call])
    b = randn(g, (n, n), torch.float32, grad=True)
    return [b]

def f(b):
    t0 = b.floor()
    t1 = t0.sin()
    t2 = t1 / b
    t4 = t2 - t0
    t5 = torch.sqrt(t4)
    return (t4, t5)
''', backend)


# -- new: an input written with a value that requires grad must require grad after the call ------------------------
@backends("aot_eager", "inductor")
def test_input_written_with_a_value_that_requires_grad(backend):
    check_program('''
# kiln fuzz program, minimized from seed 156, backend aot_eager
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(156 * 10 + call)
    n, m = ((5, 3, 4)[call], (3, 3, 3)[call])
    b = randn(g, [(3,), (3,), (2, 3)][call], torch.float32)
    d = randn(g, (), torch.float32, grad=True)
    return [b, d]

def f(b, d):
    b[...] = d
    return None
''', backend)


# -- new: an in-place view op (t_, unsqueeze_) on an input crashed: as_strided_ left after functionalization -----
@backends("aot_eager", "inductor")
def test_in_place_view_op_on_an_input(backend):
    # seed 144, minimized by hand
    check_program('''
CALLS = 3
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(144 * 10 + call)
    n = (2, 5, 7)[call]
    b = ints(g, [(n,), (n,), (2, n)][call], torch.int64, edges=True)
    return [b]

def f(b):
    t0 = b.t_() if b.dim() == 2 else b.unsqueeze_(0)
    t2 = b * t0
    return t2, b
''', backend)


# -- new: shape guards read an input's metadata after an in-place view op (t_) changed it -------------------------
@backends("eager", "aot_eager")
def test_size_read_before_an_in_place_view_op_on_an_input(backend):
    check_program('''
# kiln fuzz program, minimized from seed 1381, backend eager
CALLS = 3
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1381 * 10 + call)
    n, m = ((7, 2, 5)[call], (3, 4, 3)[call])
    a = randn(g, (n, m), torch.float32)
    b = a.detach()[:2]
    c = randn(g, (n, n), torch.float32, grad=True)
    return [b, c]

def f(b, c):
    p0 = int(b.numel())
    t2 = b.t_() if b.dim() == 2 else b.unsqueeze_(0)
    t3 = c.t() @ c
    return [p0]
''', backend)

# -- new: checks of eager's kernels that functionalization or dead-code elimination lost -----------------------------
@backends("aot_eager", "inductor")
def test_unused_bool_subtraction_raises(backend):
    # seed 169, minimized by hand
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(169 * 10 + call)
    return [randn(g, (4, 4), torch.float32)]

def f(a):
    t1 = (a.t() @ a) == a
    t6 = t1 - 1
    return t1 ^ t1
''', backend)


@backends("aot_eager", "inductor")
def test_unused_integer_division_by_zero_raises(backend):
    # seed 239, minimized by hand
    check_program('''
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(239 * 10 + call)
    return [randn(g, (3, 2), torch.float32)]

def f(a):
    t0 = torch.nan_to_num(a).clamp(-1000, 1000).to(torch.int64)
    t3 = t0 // t0
    return a,
''', backend)


# -- new: signed overflow in generated C++ (undefined there, wraps in eager): -a > -b was folded into b > a --------
@backends("inductor")
def test_wrapped_negation_compared(backend):
    check_program('''
# kiln fuzz program, minimized from seed 1868, backend inductor
CALLS = 1
DYNAMIC = None
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(1868 * 10 + call)
    n, m = ((5, 7, 3)[call], (1, 4, 2)[call])
    a = ints(g, (n, 4), torch.int64, edges=True)
    b = a.detach()[:2]
    return [a, b]

def f(a, b):
    t0 = b.clone()
    t1 = t0.unflatten(0, (t0.shape[0], 1))
    t0.neg_()
    t3 = torch.where(t0 > t1, t0, t1)
    t4 = t3.squeeze()
    p6 = int(t4.numel())
    t8 = t4.abs()
    return ((t8, a, p6),)
''', backend)


# -- new: a float32 variance whose squared deviations overflow float32 (eager's CPU var accumulates in double) ----
# the backward divides by sym_float(n - 1) under dynamic sizes: kiln cannot lower a SymFloat, the graph runs
# through ATen
@pytest.mark.allows_fallback("graph: a SymFloat in the backward")
@backends("inductor")
def test_std_of_huge_values_accumulates_in_double(backend):
    check_program('''
# kiln fuzz program, minimized from seed 787, backend inductor
CALLS = 3
DYNAMIC = True
NO_GRAD = False

def inputs(call):
    g = torch.Generator().manual_seed(787 * 10 + call)
    n, m = ((5, 7, 3)[call], (4, 2, 4)[call])
    a = randn(g, (), torch.float32, grad=True)
    b = ints(g, (3, 3, 1), torch.int64, edges=True)
    return [a, b]

def f(a, b):
    t1 = a + b
    t1.add_(b)
    t3 = t1.reshape(-1)
    t4 = t3.std()
    return [t4[...]]
''', backend)
