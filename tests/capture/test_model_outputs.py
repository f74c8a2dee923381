"""transformers' ModelOutput made inside the compiled function, then given a field by attribute.

ModelOutput is an OrderedDict dataclass whose keys are the fields that are not None; its `__setattr__`
stores a field that is not None as a key as well, at the end of the order when it is new
(`text_outputs.pooler_output = proj(...)` in Chinese-CLIP, whose text model has no pooler). kiln models
that key set (values/objects.py RecordedObjectValue); each case compares the object, its keys, its
tuple and positional reads with eager's, and the graph count with torch.compile's.
"""
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import kiln
from support.capture import CountingBackend, assert_same

modeling_outputs = pytest.importorskip("transformers.modeling_outputs")
Pooled = modeling_outputs.BaseModelOutputWithPooling


def field_added_by_attribute(x):
    out = Pooled(last_hidden_state=x * 2)
    out.pooler_output = out.last_hidden_state[:, 0] + 1
    return out, out.to_tuple(), list(out.keys()), out[1]


def field_added_after_others(x):
    out = Pooled(last_hidden_state=x, hidden_states=(x + 1,))
    out.pooler_output = x.sum(0)
    return out, out.to_tuple(), list(out.keys()), out[-1], out["pooler_output"]


def present_field_replaced(x):
    out = Pooled(last_hidden_state=x, pooler_output=x[0])
    out.pooler_output = x[1] * 3
    return out, out.to_tuple(), list(out.keys())


CASES = [field_added_by_attribute, field_added_after_others, present_field_replaced]


def _plain(result):
    """The ModelOutput as (class, its items), so that the comparison covers the key order."""
    out, *rest = result
    return (type(out), list(out.items()), out.pooler_output, *rest)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_model_output_field_set_by_attribute(fn):
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    counter = CompileCounter()
    torch.compile(fn, backend=counter, fullgraph=True)(x)
    backend = CountingBackend()
    assert_same(_plain(fn(x)), _plain(kiln.compile(fn, backend=backend, fullgraph=True)(x)))
    assert backend.graphs == counter.frame_count == 1


def test_setting_a_field_to_none_keeps_the_key_and_breaks():
    """`out.field = None` changes the attribute but not the dict entry: not modelled, a break that leaves
    eager's object (attribute None, key still holding the tensor)."""
    def clear(x):
        out = Pooled(last_hidden_state=x, pooler_output=x[0])
        out.pooler_output = None
        return out, out.pooler_output, list(out.keys())

    x = torch.randn(3, 4)
    expected, got = clear(x), kiln.compile(clear, backend=CountingBackend())(x)
    assert got[1] is None and got[2] == expected[2] == ["last_hidden_state", "pooler_output"]
    assert_same(got[0]["pooler_output"], expected[0]["pooler_output"])
