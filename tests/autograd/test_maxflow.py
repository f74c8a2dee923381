"""Dinic's max-flow against hand-made cuts and brute force."""
import itertools
import math
import random

import pytest

from kiln.autograd.maxflow import FlowGraph


def test_classic_example():
    g = FlowGraph()
    for u, v, c in [("s", "a", 10), ("s", "b", 5), ("a", "b", 15), ("a", "t", 5), ("b", "t", 10)]:
        g.add_edge(u, v, c)
    assert g.max_flow("s", "t") == 15


def test_infinite_edges_and_cut_closest_to_sink():
    g = FlowGraph()
    g.add_edge("s", "a", math.inf)
    g.add_edge("a", "b", 4)  # two cuts of capacity 4: at a->b or at c->d
    g.add_edge("b", "c", math.inf)
    g.add_edge("c", "d", 4)
    g.add_edge("d", "t", math.inf)
    assert g.max_flow("s", "t") == 4
    assert g.sink_side("t") == {"d", "t"}  # the later of the two equal cuts


def test_infinite_path_is_an_error():
    g = FlowGraph()
    g.add_edge("s", "t", math.inf)
    with pytest.raises(ValueError):
        g.max_flow("s", "t")


def brute_force_min_cut(n, edges):
    best = math.inf
    for side in itertools.product([0, 1], repeat=n - 2):
        source_side = {0} | {i + 1 for i, b in enumerate(side) if b}
        cut = sum(c for u, v, c in edges if u in source_side and v not in source_side)
        best = min(best, cut)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_match_brute_force(seed):
    rng = random.Random(seed)
    n = 7  # node 0 is the source, node n-1 the sink
    edges = [(u, v, rng.randint(1, 9)) for u in range(n) for v in range(n) if u != v and rng.random() < 0.35]
    g = FlowGraph()
    for node in range(n):
        g.node(node)
    for u, v, c in edges:
        g.add_edge(u, v, c)
    flow = g.max_flow(0, n - 1)
    assert flow == brute_force_min_cut(n, edges)
    sink_side = g.sink_side(n - 1)
    assert sum(c for u, v, c in edges if u not in sink_side and v in sink_side) == flow
