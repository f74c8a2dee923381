"""`super()` in classmethods and `super()` alive at a graph break (kiln/capture/values/objects.py, SuperValue).

A classmethod's `super()` is bound to a class, not an instance (autograd.Function.apply, __init_subclass__,
alternate constructors); a `super()` proxy on the stack when a graph break happens must be rebuilt natively.
"""
from __future__ import annotations

import torch

from support.capture import check


class Base:
    k = 1

    def __init__(self, scale):
        self.scale = scale

    @classmethod
    def make(cls, x):
        return x * cls.k

    @staticmethod
    def helper(x):
        return x + 1

    @classmethod
    def build(cls, scale):
        return cls(scale)


class Child(Base):
    k = 3

    def __init__(self, scale):
        super().__init__(_printed(scale))  # the break happens while super().__init__ is on the stack

    @classmethod
    def make(cls, x):
        return super().make(x) + super().helper(x)

    @classmethod
    def build(cls, scale):
        return super().build(scale * 2)


def _printed(value):
    print(end="")
    return value


def test_super_in_a_classmethod_reaches_the_base_classmethod():
    check(lambda x: Child.make(x), torch.randn(3), graphs=1, fullgraph=True)


def test_super_in_a_classmethod_constructing_through_the_base():
    check(lambda x: x * Child.build(2.0).scale, torch.randn(3))


def test_super_alive_at_a_graph_break():
    check(lambda x: x * Child(3.0).scale + 1, torch.randn(3))
