"""Items of an extern's tuple result that nothing reads are never taken out of the result.

A fused attention's fake result (what kiln lowers from) has a tensor where the op itself may return None: cuDNN
attention's logsumexp when none is asked for, at inference. kiln bound every item and compared its strides, so
Hugging Face Llama in bf16 inference on an H100 raised `'NoneType' object has no attribute 'stride'` and re-ran
eagerly. `kiln_test::pair` reproduces that contract on the CPU: its fake gives two tensors, the op one tensor and
None where the second is not asked for.
"""
from __future__ import annotations

import torch

from support.lowering import check

_lib = torch.library.Library("kiln_test", "DEF")
_lib.define("pair(Tensor x, bool second) -> (Tensor, Tensor)")
_lib.impl("pair", lambda x, second: (x * 2, x + 1 if second else None), "CPU")
_lib.impl("pair", lambda x, second: (torch.empty_like(x), torch.empty_like(x)), "Meta")
pair = torch.ops.kiln_test.pair.default


def first_item_only(x):
    return pair(x, False)[0].sin()


def first_item_returned(x):
    return pair(x, False)[0]


def both_items_read(x):
    first, second = pair(x, True)
    return first * second


def second_item_returned(x):
    return pair(x.cos(), True)[1]


def test_an_unread_item_the_op_returns_as_none_is_not_bound():
    compiled = check(first_item_only, torch.randn(3, 5))
    assert "[1]" not in compiled.artefacts["wrapper.py"], compiled.artefacts["wrapper.py"]


def test_an_unread_item_beside_a_returned_one():
    check(first_item_returned, torch.randn(4, 2))


def test_items_that_are_read_are_bound():
    compiled = check(both_items_read, torch.randn(3, 5))
    assert "[1]" in compiled.artefacts["wrapper.py"]


def test_only_the_returned_item():
    compiled = check(second_item_returned, torch.randn(6))
    assert "[0]" not in compiled.artefacts["wrapper.py"], compiled.artefacts["wrapper.py"]
