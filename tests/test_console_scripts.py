"""One doorway per tool: every module that runs as a program has a console script in
``setup.py`` (training included), each script's target imports and is callable, and
``tools/*.py`` are thin shims onto those same targets."""

from __future__ import annotations

import ast
import importlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _console_scripts() -> dict[str, str]:
    """``{script: "module:attr"}`` from setup.py's ``entry_points`` (read, not run)."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "entry_points":
            specs = ast.literal_eval(node.value)["console_scripts"]
            return dict(spec.replace(" ", "").split("=", 1) for spec in specs)
    raise AssertionError("setup.py has no entry_points")


def _program_modules() -> set[str]:
    """Modules of the package with an ``if __name__ == "__main__":`` block."""
    found = set()
    for dirpath, _, names in os.walk(os.path.join(ROOT, "megatron_endprompt")):
        for name in names:
            path = os.path.join(dirpath, name)
            if name.endswith(".py") and \
                    '__name__ == "__main__"' in open(path, encoding="utf-8").read():
                found.add(os.path.relpath(path, ROOT)[:-3].replace(os.sep, "."))
    return found


def test_every_program_module_has_a_console_script():
    targets = {spec.split(":")[0] for spec in _console_scripts().values()}
    missing = _program_modules() - targets
    assert not missing, f"no console script for {sorted(missing)} (setup.py entry_points)"
    assert "megatron_endprompt.training.pretrain" in targets


def test_console_script_targets_are_callable():
    for script, spec in _console_scripts().items():
        module, attr = spec.split(":")
        assert callable(getattr(importlib.import_module(module), attr)), script


def test_tools_are_thin_shims_onto_console_script_targets():
    targets = set(_console_scripts().values())
    tools = os.path.join(ROOT, "tools")
    for name in sorted(os.listdir(tools)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(tools, name), encoding="utf-8").read())
        ours = [f"{n.module}:{a.name}" for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("megatron_endprompt")
                for a in n.names]
        assert len(ours) == 1 and ours[0] in targets, (name, ours)
        defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defs, (f"tools/{name} defines {[d.name for d in defs]}: "
                          "logic belongs in the package")
