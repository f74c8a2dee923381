"""Maximum flow and minimum cut (Dinic's algorithm) on small graphs.

The partitioner's flow graphs have a few thousand nodes; Dinic's blocking flows
over BFS levels finish them in well under a second in pure Python. Capacities
are ints or `math.inf`.
"""
from __future__ import annotations

import math
from collections import deque


class FlowGraph:
    """A directed graph with capacities; nodes are any hashable values."""

    def __init__(self):
        self.index: dict = {}
        self.heads: list[int] = []   # per edge: node it points to
        self.caps: list[float] = []  # per edge: residual capacity; edge e ^ 1 is its reverse
        self.adj: list[list[int]] = []

    def node(self, key) -> int:
        if key not in self.index:
            self.index[key] = len(self.adj)
            self.adj.append([])
        return self.index[key]

    def add_edge(self, u, v, capacity: float) -> None:
        a, b = self.node(u), self.node(v)
        self.adj[a].append(len(self.heads))
        self.heads.append(b)
        self.caps.append(capacity)
        self.adj[b].append(len(self.heads))
        self.heads.append(a)
        self.caps.append(0)

    def max_flow(self, source, sink) -> float:
        """Push the maximum flow from `source` to `sink`; leaves the residual graph behind."""
        s, t = self.node(source), self.node(sink)
        total = 0
        while True:
            level = self._levels(s)
            if level[t] < 0:
                return total
            cursor = [0] * len(self.adj)
            while True:
                pushed = self._augment(s, t, level, cursor)
                if pushed == 0:
                    break
                total += pushed
                if total == math.inf:
                    raise ValueError("maxflow: infinite capacity path from source to sink")

    def _levels(self, s: int) -> list[int]:
        level = [-1] * len(self.adj)
        level[s] = 0
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for e in self.adj[u]:
                v = self.heads[e]
                if self.caps[e] > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level

    def _augment(self, s: int, t: int, level: list[int], cursor: list[int]) -> float:
        """Find one augmenting path along increasing levels (iterative DFS) and push through it."""
        path: list[int] = []
        u = s
        while u != t:
            advanced = False
            while cursor[u] < len(self.adj[u]):
                e = self.adj[u][cursor[u]]
                v = self.heads[e]
                if self.caps[e] > 0 and level[v] == level[u] + 1:
                    path.append(e)
                    u = v
                    advanced = True
                    break
                cursor[u] += 1
            if not advanced:
                if not path:
                    return 0
                level[u] = -1  # dead end: never enter it again in this phase
                e = path.pop()
                u = self.heads[e ^ 1]
                cursor[u] += 1
        pushed = min(self.caps[e] for e in path)
        for e in path:
            self.caps[e] -= pushed
            self.caps[e ^ 1] += pushed
        return pushed

    def sink_side(self, sink) -> set:
        """After `max_flow`: the nodes that can still reach `sink` in the residual graph.

        Its complement is the source side of the minimum cut that lies *closest to the
        sink*: of all cuts of minimum capacity, the one that keeps the most nodes on the
        source side. The partitioner wants that one: equal bytes, least recomputation.
        """
        t = self.node(sink)
        seen = {t}
        queue = deque([t])
        while queue:
            v = queue.popleft()
            for e in self.adj[v]:
                u = self.heads[e]
                # u can reach v if the residual capacity of the edge u -> v (the reverse of e) is positive.
                if u not in seen and self.caps[e ^ 1] > 0:
                    seen.add(u)
                    queue.append(u)
        keys = {i: k for k, i in self.index.items()}
        return {keys[i] for i in seen}
