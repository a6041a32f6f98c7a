"""No import cycle inside the region, the edge or the ground floor: each
reads from its entry points down, and a module can be understood (and
tested) before the modules that use it. TYPE_CHECKING and function-level
imports count: a cycle hidden in a function is still a cycle."""

from __future__ import annotations

import grimp
import pytest

ACYCLIC = ("llmmesh.region", "llmmesh.edge", "llmmesh.core")


def cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The import cycles among ``package``'s modules: each strongly connected
    component of more than one module (Tarjan's algorithm, iteratively)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, at = work.pop()
            if at == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for position in range(at, len(edges[node])):
                nxt = edges[node][position]
                if nxt not in index:
                    work.append((node, position + 1))
                    work.append((nxt, 0))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return found


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("llmmesh", include_external_packages=False)


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle(graph: grimp.ImportGraph, package: str) -> None:
    assert cycles(graph, package) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """One import back up the region (settings -> gateway) is a cycle it reports."""
    graph = grimp.build_graph("llmmesh", include_external_packages=False)
    graph.add_import(importer="llmmesh.region.settings", imported="llmmesh.region.gateway")
    found = cycles(graph, "llmmesh.region")
    assert found and "llmmesh.region.settings" in found[0] and "llmmesh.region.gateway" in found[0]
