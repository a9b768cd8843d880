"""The style the project keeps by a tool: ``ruff check`` with the repository's ``ruff.toml``
passes on the whole tree (ruff is pinned in requirements-dev.txt)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from benchmarks.evaluation.import_map import circles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_passes_on_the_tree():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format", "concise", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert "No module named ruff" not in proc.stderr, \
        "ruff is not installed: pip install -r requirements-dev.txt"
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Files another change is rewriting now (the evaluation rooms, the replication study); they
#: keep their issue numbers until it lands. The list only shrinks (a stale entry fails too).
ISSUE_NUMBERS_NOT_YET_REMOVED: frozenset[str] = frozenset()


def _issue_numbers(tops: tuple[str, ...], suffixes: tuple[str, ...]) -> dict[str, list[str]]:
    """``{file: [line: text]}`` of every line naming a tracker issue under ``tops``."""
    pattern = re.compile(r"\bissues? #?\d+|\(issue\b|\bissue-\d+", re.IGNORECASE)
    found: dict[str, list[str]] = {}
    for top in tops:
        for dirpath, _, names in os.walk(os.path.join(ROOT, top)):
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, ROOT)
                if not name.endswith(suffixes) or rel == "tests/test_lint.py":  # its own pattern
                    continue
                with open(path, encoding="utf-8") as f:
                    lines = [f"{i}: {line.strip()}" for i, line in enumerate(f, 1)
                             if pattern.search(line)]
                if lines:
                    found[rel] = lines
    return found


def test_no_project_issue_numbers_in_the_package():
    """Code says why, not which ticket asked: a docstring's "(issue 15)" means nothing to a
    reader without the tracker."""
    found = _issue_numbers(("megatron_endprompt", "tools"), (".py",))
    assert not found, "\n".join(f"{f}:{line}" for f, lines in found.items() for line in lines)


def test_no_project_issue_numbers_in_tests_and_benchmarks():
    """Tests and benchmarks too: a test says which defect it guards, a benchmark which goal it
    measures, in words."""
    found = _issue_numbers(("tests", "benchmarks"), (".py", ".md", ".sh"))
    new = {f: lines for f, lines in found.items() if f not in ISSUE_NUMBERS_NOT_YET_REMOVED}
    assert not new, "\n".join(f"{f}:{line}" for f, lines in new.items() for line in lines)
    stale = sorted(ISSUE_NUMBERS_NOT_YET_REMOVED - set(found))
    assert not stale, f"issue numbers gone: drop {stale} from ISSUE_NUMBERS_NOT_YET_REMOVED"


# --- the import graph: module-level and function-local imports of our own modules -------------

PACKAGE = "megatron_endprompt"

#: The comment a function-local import of our own module carries (on its line or the line
#: above), saying what it spares: ``# lazy: spares torch`` / ``# lazy: spares Megatron``.
LAZY_MARKER = re.compile(r"#\s*lazy: spares (torch|Megatron)")

#: What a function-local import may spare: torch or Megatron at start-up (the house rule).
HEAVY = frozenset({"torch", "megatron"})

#: Function-local imports of our own modules that the rule above does not admit yet, as
#: ``{file: modules imported}`` under the package: they spare neither torch nor Megatron (hoist
#: them to module level) or lack the comment. Each sits in a room another change is editing
#: now; the list only shrinks (a stale entry fails too, so it stays true).
_PENDING: dict[str, tuple[str, ...]] = {
    "runtime/__init__.py": ("runtime.cpu", "runtime.rope", "runtime.wheel"),
    "training/args.py": (
        "data.dataset", "data.sidecar.trust", "data.split_counts", "training.checks",
    ),
    "training/checks.py": ("data.prepare.atomic_output",),
    "training/launch_flags.py": ("training.args",),
    "training/long_eval.py": ("evaluation.passkey.passkey", "evaluation.perplexity.windows"),
    "training/pretrain.py": (
        "data.coverage", "data.sidecar.sidecar", "runtime.versions", "training.args",
        "training.cli_args", "training.long_eval", "training.providers", "training.run",
        "training.schedule_check",
    ),
    "training/providers.py": (
        "data.dataset", "model", "runtime", "training.batch", "training.loss",
    ),
    "training/run.py": ("data.prepare.prefix_name", "data.sidecar.sidecar"),
}
NOT_YET_CONVERTED = frozenset((f"{PACKAGE}/{file}", f"{PACKAGE}.{module}")
                              for file, modules in _PENDING.items() for module in modules)


def _modules(root: str) -> dict[str, str]:
    """``{dotted module name: path}`` of every module of the package under ``root``."""
    found = {}
    for dirpath, _, names in os.walk(os.path.join(root, PACKAGE)):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(path: str, modules: dict[str, str]):
    """``(node, module imported, local)`` for every import of one of ``modules`` in ``path``:
    ``local`` when it sits inside a function. Imports under ``if TYPE_CHECKING:`` are left out
    (never run); ``from pkg import mod`` names the module ``pkg.mod``."""
    import ast

    def target(module: str, name: str | None) -> str | None:
        if name is not None and f"{module}.{name}" in modules:
            return f"{module}.{name}"
        return module if module in modules else None

    def visit(node, local: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if target(alias.name, None):
                        yield child, target(alias.name, None), inner
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                for alias in child.names:
                    if target(child.module, alias.name):
                        yield child, target(child.module, alias.name), inner
            yield from visit(child, inner)

    with open(path, encoding="utf-8") as f:
        yield from visit(ast.parse(f.read()), False)


def import_graph(root: str) -> dict[str, set[str]]:
    """``{module: modules it imports}``, function-local imports included."""
    modules = _modules(root)
    return {m: {t for _, t, _ in _imports(p, modules) if t != m} for m, p in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each holds a cycle): the
    import map's Tarjan (``benchmarks/evaluation/import_map.py``), one implementation."""
    edges = {(v, w) for v, targets in graph.items() for w in targets}
    nodes = sorted(set(graph) | {w for _, w in edges})
    return sorted(circles(edges, nodes))


def _heavy_at_start_up(root: str) -> dict[str, frozenset[str]]:
    """``{module: which of HEAVY importing it loads}``: its own module-level imports, those of
    the packages above it (Python runs their ``__init__`` first) and of every module of ours it
    imports at module level, transitively."""
    import ast

    modules = _modules(root)
    direct, ours = {}, {}
    for m, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        heavy: set[str] = set()
        pending = list(ast.iter_child_nodes(tree))
        while pending:  # module level: every statement outside functions and classes' bodies
            node = pending.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                heavy |= {a.name.split(".")[0] for a in node.names} & HEAVY
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                heavy |= {node.module.split(".")[0]} & HEAVY
            pending.extend(ast.iter_child_nodes(node))
        direct[m] = heavy
        parents = [".".join(m.split(".")[:i]) for i in range(2, m.count(".") + 1)]
        ours[m] = {t for _, t, local in _imports(path, modules) if not local} | set(parents)

    def closure(m: str) -> frozenset[str]:
        seen, pending = {m}, [m]
        while pending:
            for t in ours[pending.pop()] - seen:
                seen.add(t)
                pending.append(t)
        return frozenset().union(*(direct[t] for t in seen))

    return {m: closure(m) for m in modules}


def local_import_findings(root: str) -> tuple[set[tuple[str, str]], int]:
    """``({(file, module)} of the function-local imports the rule does not admit, number of
    function-local import statements of our modules)``. Admitted: the imported module loads
    torch or Megatron that the importing module does not, and a ``LAZY_MARKER`` comment says so
    on the import's lines or the line above."""
    modules = _modules(root)
    heavy = _heavy_at_start_up(root)
    bad, statements = set(), set()
    for m, path in modules.items():
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for node, target, local in _imports(path, modules):
            if not local:
                continue
            statements.add((path, node.lineno))
            said = any(LAZY_MARKER.search(line)
                       for line in lines[max(node.lineno - 2, 0):node.end_lineno])
            if not (said and heavy[target] - heavy[m]):
                bad.add((os.path.relpath(path, root).replace(os.sep, "/"), target))
    return bad, len(statements)


def test_the_import_graph_has_no_cycles():
    """Function-local imports count: an import inside a function hid two circles from a lint
    that read module-level imports only (the start-up checks <-> the run builder, the tiktoken
    <-> SentencePiece encoders)."""
    assert import_cycles(import_graph(ROOT)) == []


def test_function_local_imports_spare_torch_or_megatron_and_say_so():
    bad, _ = local_import_findings(ROOT)
    new = sorted(bad - NOT_YET_CONVERTED)
    assert not new, ("function-local imports of our modules that spare neither torch nor "
                     "Megatron at start-up (import at module level), or lack the "
                     "'# lazy: spares torch' comment:\n" + "\n".join(map(str, new)))
    stale = sorted(NOT_YET_CONVERTED - bad)
    assert not stale, "converted: drop from NOT_YET_CONVERTED:\n" + "\n".join(map(str, stale))


def _write(root, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = os.path.join(str(root), PACKAGE, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return str(root)


def test_the_lint_sees_a_cycle_hidden_in_a_function(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "from megatron_endprompt import b\n",
        "b.py": "def f():\n    from megatron_endprompt.a import g\n    return g\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from megatron_endprompt import a\n"})
    assert import_cycles(import_graph(root)) == [[f"{PACKAGE}.a", f"{PACKAGE}.b"]]


def test_the_lint_admits_a_marked_import_that_spares_torch_only(tmp_path):
    root = _write(tmp_path, {
        "__init__.py": "",
        "heavy.py": "import torch\n",
        "light.py": "X = 1\n",
        "ok.py": "def f():\n    # lazy: spares torch at start-up\n"
                 "    from megatron_endprompt.heavy import torch\n",
        "unsaid.py": "def f():\n    from megatron_endprompt.heavy import torch\n",
        "spares_nothing.py": "def f():\n"
                             "    from megatron_endprompt.light import X  # lazy: spares torch\n",
        "already_heavy.py": "import torch\n\n\ndef f():\n"
                            "    from megatron_endprompt import heavy  # lazy: spares torch\n"})
    bad, statements = local_import_findings(root)
    assert statements == 4
    assert bad == {(f"{PACKAGE}/unsaid.py", f"{PACKAGE}.heavy"),
                   (f"{PACKAGE}/spares_nothing.py", f"{PACKAGE}.light"),
                   (f"{PACKAGE}/already_heavy.py", f"{PACKAGE}.heavy")}
