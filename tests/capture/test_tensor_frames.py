"""Functions called natively are compiled only when their frame holds tensors or modules.

After a graph break, or in a frame stepped through natively, kiln calls functions for real and compiles the
Python ones as frames of their own (`entry.call_nested`) when a tensor or module is among their locals on entry
(`capture/tensor_frames.py`), as torch.compile's frame hook does; other helpers run as plain Python and answer
`torch.compiler.is_compiling()` with False, as eager does. (torch.compile also compiles a helper whose code names
torch; kiln runs it natively, and so keeps eager's answer there.) The cases compare with eager and torch.compile.
"""
import pytest
import torch

import kiln
from support.capture import CountingBackend, assert_same

# A helper from a module that imports torch only inside it (transformers' `is_torchdynamo_compiling`): torch is
# not among its globals, so its frame holds nothing of torch's.
_HELPER_MODULE: dict = {}
exec("def compiling_flag():\n    import torch\n    return torch.compiler.is_compiling()\n", _HELPER_MODULE)
compiling_flag = _HELPER_MODULE["compiling_flag"]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, mask, scale):
        return self.linear(x).relu() * mask * scale


class Stack(torch.nn.Module):
    """A module whose forward takes a mask-free path under compilation and raises on it (as LongT5's stack
    does when `is_torchdynamo_compiling()` skips building its attention mask)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, x, mask=None):
        if mask is None and not compiling_flag():
            mask = torch.ones(x.shape[0], 1)
        scale = mask.shape[-1]  # None.shape on the compiling path: eager never gets here with None
        for block in self.blocks:
            x = block(x, mask, scale)
        return x


def _graph_counts(fn, *args):
    torch._dynamo.reset()
    reference = CountingBackend()
    expected = torch.compile(fn, backend=reference)(*args)
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(2):
        assert_same(compiled(*args), expected)
    return backend.graphs, reference.graphs


@pytest.mark.allows_fallback("graph_break: the exception on the compiling path is a break torch.compile takes too")
def test_a_frame_raising_on_the_compiling_path_runs_natively_and_compiles_its_calls():
    model, x = Stack(), torch.randn(4, 8)
    kiln_graphs, torch_graphs = _graph_counts(model, x)
    assert_same(kiln.compile(model)(x), model(x))
    # the blocks are compiled, not the whole stack run eagerly: a graph per block instance (torch.compile shares
    # one among them, their parameters being its graph inputs)
    assert 1 <= torch_graphs <= kiln_graphs <= len(model.blocks)


def no_torch_in_frame(n):
    return compiling_flag() or n < 0


def tensor_in_frame(x):
    return compiling_flag(), x + 1


def names_torch(n):
    return torch.compiler.is_compiling(), n


class Holder(torch.nn.Module):
    def flag(self, n):
        return compiling_flag(), n


def in_a_natively_stepped_loop(xs, helper, arg):
    out = []
    for x in xs:
        print(end="")  # a break inside a loop: the frame is stepped through natively, its calls one by one
        out.append((x * 2, helper(arg)))
    return out


# (helper, its argument, the is_compiling() answer it returns called from a frame stepped through natively)
HELPERS = {
    "no_torch": (no_torch_in_frame, 3, False),  # eager's answer; torch.compile's too (it skips the frame)
    "tensor_argument": (tensor_in_frame, torch.ones(2), True),  # a compiled frame, under both compilers
    "torch_global": (names_torch, 3, False),  # eager's answer (torch.compile compiles the frame: True)
    "module_method": (Holder().flag, 3, True),  # the bound module is a local
}


@pytest.mark.allows_fallback("graph_break: print in a loop, which torch.compile breaks on too")
@pytest.mark.parametrize("name", HELPERS)
def test_a_helper_called_natively_is_compiled_when_its_frame_holds_tensors(name):
    helper, arg, compiled_answer = HELPERS[name]
    xs = [torch.randn(3) for _ in range(2)]
    got = kiln.compile(in_a_natively_stepped_loop, backend="eager")(xs, helper, arg)
    assert_same([t for t, _ in in_a_natively_stepped_loop(xs, helper, arg)], [t for t, _ in got])
    assert _flags(got) == [compiled_answer] * len(xs)
    if name != "torch_global":
        torch._dynamo.reset()
        assert _flags(torch.compile(in_a_natively_stepped_loop, backend="eager")(xs, helper, arg)) == _flags(got)


def _flags(results):
    """The is_compiling() answers the helpers returned (alone, or first in a tuple)."""
    return [value if isinstance(value, bool) else value[0] for _, value in results]
