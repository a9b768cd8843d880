"""The map of a package's house: files, rooms, floors and arrows, read with ``ast``.

An arrow is one import of a module of the same package by another (function-local imports
included: a circle hidden inside a function is still a circle); ``import a.b`` and ``from a
import b`` where ``b`` is a module both count as an arrow to that module, and an import of a
sub-package's ``__init__`` counts as an arrow to it. A floor is a level of the longest chain of
arrows: a module importing nothing of the package is on floor 1, any other one floor above the
highest module it imports. A room is a directory holding modules (the top directory included).

    python -m benchmarks.evaluation.import_map megatron_endprompt/evaluation

prints ``files``, ``rooms``, ``floors``, ``arrows``, ``circles``, ``upward`` (arrows from a
room into a directory above it, which a room should never need), ``room_arrows`` and
``room_circles`` (the same graph between rooms) as one JSON object.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from typing import Any

__all__ = ["module_names", "arrows", "house_map", "main"]


def module_names(root: str) -> dict[str, str]:
    """Dotted module name -> file path of every ``.py`` under ``root`` (a package directory;
    names start at the outermost package above it)."""
    base = os.path.dirname(os.path.abspath(root))
    while os.path.isfile(os.path.join(base, "__init__.py")):
        base = os.path.dirname(base)
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def _targets(node: ast.AST, here: str, is_package: bool, modules: dict[str, str]) -> list[str]:
    """The modules one import statement imports: ``from pkg import mod`` names ``pkg.mod``
    only, ``from pkg import name`` (not a module) names ``pkg``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        parts = here.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        prefix = ".".join(parts[:keep])
        module = f"{prefix}.{node.module}" if node.module else prefix
    else:
        module = node.module or ""
    subs = [f"{module}.{a.name}" for a in node.names]
    return [s for s in subs if s in modules] + (
        [module] if any(s not in modules for s in subs) else [])


def arrows(modules: dict[str, str]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair between two modules of ``modules``."""
    out = set()
    for name, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        is_package = path.endswith("__init__.py")
        for node in ast.walk(tree):
            for target in _targets(node, name, is_package, modules):
                if target in modules and target != name:
                    out.add((name, target))
    return out


def circles(edges: set[tuple[str, str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(1000, 10 * len(nodes)))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for n in nodes:
        if n not in index:
            visit(n)
    return found


def _floors(edges: set[tuple[str, str]], nodes: list[str]) -> int:
    """Length of the longest chain of arrows, in modules (0 with a circle: no floors)."""
    deps: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        deps[a].append(b)
    level: dict[str, int] = {}

    def floor(n: str, seen: frozenset[str]) -> int:
        if n in level:
            return level[n]
        if n in seen:
            raise ValueError("circle")
        level[n] = 1 + max((floor(d, seen | {n}) for d in deps[n]), default=0)
        return level[n]

    try:
        return max((floor(n, frozenset()) for n in nodes), default=0)
    except ValueError:
        return 0


def house_map(root: str) -> dict[str, Any]:
    """Files (``__init__`` excluded), rooms, floors, arrows, circles and upward arrows of the
    package at ``root``."""
    modules = module_names(root)
    edges = arrows(modules)
    nodes = sorted(modules)
    files = [n for n, p in modules.items() if not p.endswith("__init__.py")]
    rooms = sorted({os.path.dirname(p) for p in modules.values()})

    def room(name: str) -> str:
        path = modules[name]
        return os.path.dirname(path)

    room_edges = {(room(a), room(b)) for a, b in edges if room(a) != room(b)}
    upward = sorted(f"{a} -> {b}" for a, b in edges
                    if room(a) != room(b) and room(a).startswith(room(b) + os.sep)
                    and not modules[b].endswith("__init__.py"))
    return {"root": root, "files": len(files), "rooms": len(rooms), "floors": _floors(edges, nodes),
            "arrows": len(edges), "circles": circles(edges, nodes), "upward": upward,
            "room_arrows": len(room_edges), "room_circles": circles(room_edges, rooms)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="a package directory, e.g. megatron_endprompt/evaluation")
    args = p.parse_args(argv)
    print(json.dumps(house_map(args.root), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
