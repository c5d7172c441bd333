#!/usr/bin/env python3
"""Check that so101d's imports point one way and form no circle.

    python .ci/check_imports.py            # exit 0 when clean, 1 with one line per problem
    python .ci/check_imports.py --graph    # also print every package-to-package edge

The layers, bottom to top (a package may import its own layer and the ones below it):

    calibration   pure data: the joint table, unit conventions, the calibration file
    drivers       hardware behind small interfaces: the STS3215 bus and codec, the arms, the
                  emulator, the cameras, the simulated-follower client
    daemon        the control loop, recording, policies, the control socket and the CLI
    sim_bridge    at the edge: the simulator servers (MuJoCo, LeIsaac) and sim-side tools

Every import counts, also one inside a function or under ``TYPE_CHECKING``: an upward import
that is "only for typing" or "only lazy" is still an arrow the reader has to hold in mind.
Circles are looked for between modules (not only packages), with the same rule.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("calibration", "drivers", "daemon", "sim_bridge")
RANK = {name: rank for rank, name in enumerate(LAYERS)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, own: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every import of one of our modules in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod when there is one
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != own and (node.lineno, name) not in found:
                found.append((node.lineno, name))
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm; returns the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check(show_graph: bool = False) -> list[str]:
    files = {module_name(p): p for layer in LAYERS for p in sorted((ROOT / layer).rglob("*.py"))}
    known = set(files)
    graph: dict[str, set[str]] = defaultdict(set)
    package_edges: dict[tuple[str, str], int] = defaultdict(int)
    problems: list[str] = []
    for mod, path in files.items():
        src_layer = mod.split(".")[0]
        for line, target in imported_modules(path, mod, known):
            # a package's __init__ is imported with each of its modules: not an edge of its own
            if not (files[target].name == "__init__.py" and mod.startswith(target + ".")):
                graph[mod].add(target)
            dst_layer = target.split(".")[0]
            package_edges[(src_layer, dst_layer)] += 1
            if RANK[dst_layer] > RANK[src_layer]:
                rel = path.relative_to(ROOT)
                problems.append(
                    f"{rel}:{line}: {src_layer} imports {target} (upward: {dst_layer} sits above {src_layer})"
                )
    for comp in strongly_connected(graph):
        problems.append("import circle between modules: " + " <-> ".join(comp))
    if show_graph:
        for (src, dst), n in sorted(package_edges.items(), key=lambda kv: (RANK[kv[0][0]], RANK[kv[0][1]])):
            if src != dst:
                print(f"{src:12s} -> {dst:12s} {n:4d} imports")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", action="store_true", help="print the package-to-package edges too")
    args = parser.parse_args()
    problems = check(args.graph)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s); layers bottom to top: {' < '.join(LAYERS)}")
        return 1
    print(f"imports point one way ({' < '.join(LAYERS)}), no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
