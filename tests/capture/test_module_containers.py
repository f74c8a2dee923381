"""ModuleList, Sequential, ModuleDict and ParameterList used as containers in a forward: indexing (negative
too), slicing (a Sequential slice is called), len, iteration, reversed, `in`; each compared with eager in
one graph, and indexing out of range raising eager's IndexError."""
import pytest
import torch
import torch.nn as nn

from support.capture import check_module, t


class Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh())
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.named = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.ReLU()})
        self.params = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(3)])


class SequentialSlices(Containers):
    def forward(self, x):
        return self.seq[1:](x), self.seq[::2](x), self.seq[1:][1:](x), self.seq[:-1][-1](x), len(self.seq[1:])


class SequentialIndexing(Containers):
    def forward(self, x):
        return self.seq[0](x), self.seq[-1](x), [m(x) for m in reversed(self.seq)], self.seq[0] in self.seq


class ModuleListAccess(Containers):
    def forward(self, x):
        return (self.layers[-1](x), len(self.layers[1:]), [m(x) for m in self.layers[:2]],
                [m(x) for m in reversed(self.layers)], self.layers[0] in self.layers, self.seq[0] in self.layers)


class ModuleDictAccess(Containers):
    def forward(self, x):
        return ("a" in self.named, "z" in self.named, list(self.named), self.named["b"](x), len(self.named),
                [m(x) for m in self.named.values()], [k for k, _ in self.named.items()])


class ParameterListAccess(Containers):
    def forward(self, x):
        return [p * x for p in self.params], self.params[-1] * x, [p + 1 for p in self.params[1:]], len(self.params)


class IndexOutOfRange(Containers):
    def forward(self, x):
        try:
            return self.layers[3](x)
        except IndexError:
            return x * 2


@pytest.mark.parametrize("make", [SequentialSlices, SequentialIndexing, ModuleListAccess, ModuleDictAccess,
                                  ParameterListAccess, IndexOutOfRange])
def test_module_container_matches_eager_in_one_graph(make):
    check_module(make, t(2, 4), graphs=1)
