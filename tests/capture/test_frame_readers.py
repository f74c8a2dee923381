"""Builtins that read the calling frame, run natively after a graph break (found by CPython's test_collections,
`eval(repr(d))`): `globals()`, and `eval(s)`/`exec(s)` without a namespace, see the user's module globals, not
the output program's namespace (a NameError, or a name of kiln's own). Each case compares with eager.
"""
from __future__ import annotations

from collections import ChainMap

import pytest
import torch

import kiln

SCALE = 3.0


def reads_module_globals(x):
    chained = ChainMap({"a": 1})
    again = eval(repr(chained))  # ChainMap is a global of this module
    scale = eval("SCALE")
    namespace = {}
    exec("doubled = SCALE * 2", globals(), namespace)
    return x * scale, again == chained, namespace["doubled"], "SCALE" in globals()


@pytest.mark.allows_fallback("graph_break: eval, exec and globals() run natively")
def test_eval_exec_and_globals_see_the_users_module():
    x = torch.randn(3)
    expected = reads_module_globals(x)
    actual = kiln.compile(reads_module_globals, backend="eager")(x)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1:] == expected[1:]
