#!/usr/bin/env python3
"""Check that so101d's imports point one way and form no circle.

    python .ci/check_imports.py            # exit 0 when clean, 1 with one line per problem
    python .ci/check_imports.py --graph    # also print every package-to-package edge

The layers, bottom to top (a package may import its own layer and the ones below it):

    calibration      pure data: the joint table, unit conventions, the calibration file
    drivers          hardware behind small interfaces: the STS3215 bus and codec, the arms, the
                     emulator, the cameras, the simulated-follower client
    daemon.system    the operating system: logs, realtime scheduling, sd_notify, terminals, ports
    daemon.config    the TOML configuration and what a reload may change
    daemon.control   the loop: period and cycle, arms, target sources, safety, faults, supervisor
    daemon.data      the dataset: schema, recorder, writer, store, dataset tools, HDF5 interop
    daemon.policy    policies served beside the servos: engine, worker, the policy source
    daemon.api       the control API: typed messages, the socket server, the client
    daemon.service   the composition root: builds the daemon from its configuration
    daemon.apps      what operators run: the CLI commands, the browser console, the Rerun viewer
    sim_bridge       at the edge: the simulator servers (MuJoCo, LeIsaac) and sim-side tools

Inside daemon/ every module belongs to one of those subpackages (a module at daemon/'s top level
is reported), and each subpackage's ``__init__`` says in its docstring, on a line starting
``May import:``, the layers below it that it uses; the check holds that line to the order here.

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
LAYERS = (
    "calibration",
    "drivers",
    "daemon.system",
    "daemon.config",
    "daemon.control",
    "daemon.data",
    "daemon.policy",
    "daemon.api",
    "daemon.service",
    "daemon.apps",
    "sim_bridge",
)
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


def layer_of(module: str) -> str | None:
    """The layer a module belongs to: its top package, or daemon's subpackage."""
    parts = module.split(".")
    if parts[0] != "daemon":
        return parts[0]
    if len(parts) == 1:
        return "daemon"  # daemon/__init__.py: the package's docstring, imports nothing
    layer = ".".join(parts[:2])
    return layer if layer in RANK else None


def may_import_problems(layer: str, init: Path) -> list[str]:
    """The ``May import:`` line of a daemon layer's docstring, held to LAYERS."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    lines = [line for line in doc.splitlines() if line.startswith("May import:")]
    rel = init.relative_to(ROOT)
    if not lines:
        return [f"{rel}: the docstring has no 'May import:' line naming the layers it may use"]
    named = [name.strip() for name in lines[0].removeprefix("May import:").rstrip(".").split(",") if name.strip()]
    above = [name for name in named if name in RANK and RANK[name] >= RANK[layer]]
    unknown = [name for name in named if name not in RANK]
    out = [f"{rel}: 'May import:' names {name}, which is not below {layer}" for name in above]
    out += [f"{rel}: 'May import:' names {name}, which is no layer ({', '.join(LAYERS)})" for name in unknown]
    return out


def check(show_graph: bool = False) -> list[str]:
    tops = sorted({layer.split(".")[0] for layer in LAYERS})
    files = {module_name(p): p for top in tops for p in sorted((ROOT / top).rglob("*.py"))}
    known = set(files)
    graph: dict[str, set[str]] = defaultdict(set)
    package_edges: dict[tuple[str, str], int] = defaultdict(int)
    problems: list[str] = []
    for mod, path in files.items():
        src_layer = layer_of(mod)
        if src_layer is None:
            problems.append(
                f"{path.relative_to(ROOT)}: module outside a layer (daemon/ holds only {', '.join(x for x in LAYERS if x.startswith('daemon.'))})"
            )
            continue
        if src_layer.startswith("daemon.") and path.name == "__init__.py" and mod == src_layer:
            problems += may_import_problems(src_layer, path)
        for line, target in imported_modules(path, mod, known):
            # a package's __init__ is imported with each of its modules: not an edge of its own
            if not (files[target].name == "__init__.py" and mod.startswith(target + ".")):
                graph[mod].add(target)
            dst_layer = layer_of(target)
            if dst_layer is None or dst_layer == "daemon" or src_layer == "daemon":
                continue  # reported above as a module outside a layer, or the bare package
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
                print(f"{src:16s} -> {dst:16s} {n:4d} imports")
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
