"""The automatic dependency graph: derivation D → derivation E when D emits a
collection version that a scoped condition of one of E's triggers scopes.

Every scoped condition contributes edges — write, changed, retraction, quiet, at,
census, and accumulator/lifecycle through the driving source they aggregate.  cron
and read do not: they fire on the clock or on demand, never because a record landed,
so they cannot make a chain self-feeding.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from wakeline.catalog._common import Reporter
from wakeline.catalog.normalized import Derivation, Trigger


@dataclass(frozen=True)
class Edge:
    source: str      # the emitting derivation
    target: str      # the derivation whose trigger scopes the emission
    collection: str  # "name@version"
    trigger: str
    kind: str
    file: str
    yaml_path: str


def edges(derivations: dict[str, Derivation], triggers: dict[str, Trigger]) -> list[Edge]:
    emitters: dict[tuple[str, int], list[str]] = {}
    for d in derivations.values():
        for ref in d.emits:
            emitters.setdefault((ref.collection, ref.version), []).append(d.name)
    out: list[Edge] = []
    for t in sorted(triggers.values(), key=lambda t: t.name):
        for cond in t.conditions:
            scope = getattr(cond, "scope", None)
            if scope is None:
                continue
            for ref in scope.collections:
                for src in emitters.get((ref.collection, ref.version), []):
                    out.append(
                        Edge(src, t.derivation, ref.ref, t.name, cond.kind, t.file, cond.yaml_path)
                    )
    return out


def _sccs(nodes: list[str], adj: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succ = adj.get(node, [])
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                result.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return result


def _cycle_in(start: str, members: set[str], by_source: dict[str, list[Edge]]) -> list[Edge]:
    """The shortest edge path start → … → start inside one component (BFS)."""
    queue: deque[tuple[str, list[Edge]]] = deque([(start, [])])
    seen: set[str] = set()
    while queue:
        node, path = queue.popleft()
        for e in by_source.get(node, []):
            if e.target not in members:
                continue
            if e.target == start:
                return [*path, e]
            if e.target not in seen:
                seen.add(e.target)
                queue.append((e.target, [*path, e]))
    return []


def check_cycles(
    rep: Reporter, derivations: dict[str, Derivation], triggers: dict[str, Trigger]
) -> None:
    all_edges = edges(derivations, triggers)
    by_source: dict[str, list[Edge]] = {}
    for e in all_edges:
        by_source.setdefault(e.source, []).append(e)
    adj = {n: sorted({e.target for e in es}) for n, es in by_source.items()}
    for comp in _sccs(sorted(derivations), adj):
        members = set(comp)
        start = comp[0]
        cycle = _cycle_in(start, members, by_source)
        if not cycle:
            continue  # a single node without a self-edge
        names = " → ".join([cycle[0].source, *(e.target for e in cycle)])
        steps = "; ".join(
            f"{e.source} emits {e.collection}, which trigger {e.trigger!r} ({e.kind}) of "
            f"{e.target} scopes"
            for e in cycle
        )
        first = cycle[-1]  # the edge that closes the loop back to ``start``
        written = first.kind not in ("accumulator", "lifecycle")  # those scope the source
        narrow = (
            f"narrowing the scope of trigger {first.trigger!r} so it excludes {first.collection}"
            if written else
            f"removing {first.collection} from the source of {first.target} (a {first.kind} "
            "condition watches the driving source)"
        )
        rep.add(
            "graph.cycle", first.file,
            f"{first.yaml_path}.collections" if written else first.yaml_path,
            f"dependency cycle {names}: {steps}; these runs would feed each other forever — "
            f"break the cycle by not emitting {first.collection} from {first.source}, or by "
            f"{narrow}",
        )
