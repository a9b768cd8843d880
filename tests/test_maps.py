"""The maps a newcomer reads first stay true: the package's top ``__init__`` docstring and the
README's code layout name every top-level module and package, and every path they name exists
(the README still said ``data/build`` a room after it became ``data/prepare``)."""

from __future__ import annotations

import glob
import os
import re

import megatron_endprompt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "megatron_endprompt")


def top_level() -> set[str]:
    """Every top-level module (``disk``) and package (``data``) of the package."""
    names = set()
    for name in os.listdir(PACKAGE):
        path = os.path.join(PACKAGE, name)
        if name.endswith(".py") and name != "__init__.py":
            names.add(name[:-3])
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            names.add(name)
    return names


def readme_layout() -> str:
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = re.search(r"^## Code layout.*?$(.*?)^## ", readme, re.M | re.S)
    assert section, "README.md has no '## Code layout' section"
    return section.group(1)


def layout_paths(section: str) -> list[str]:
    """The paths in the first column of the code-layout table (``data/tokenize/``, ``disk.py``)."""
    rows = [line.split("|")[1] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")][1:]
    return [p for row in rows for p in re.findall(r"`([^`]+)`", row)]


def named_paths(section: str) -> list[str]:
    """Every backquoted path anywhere in the section: a name with a ``/`` or a ``.py`` file."""
    return [p for p in re.findall(r"`([\w./*-]+)`", section)
            if not p.startswith(".") and ("/" in p or p.endswith(".py"))]


def exists(path: str) -> bool:
    """Under the package or the repository root (globs allowed); a bare ``name.py`` anywhere in
    the package (the table names a room's files inside its row)."""
    if any(glob.glob(os.path.join(base, path)) for base in (PACKAGE, ROOT)):
        return True
    return "/" not in path and any(path in files for _, _, files in os.walk(PACKAGE))


def test_the_package_map_names_every_top_level_module_and_package():
    doc = megatron_endprompt.__doc__
    missing = sorted(n for n in top_level() if not re.search(rf"``{n}(/|``)", doc))
    assert not missing, f"megatron_endprompt/__init__.py's map does not name {missing}"


def test_every_readme_layout_path_exists_and_every_top_level_one_is_there():
    paths = layout_paths(readme_layout())
    assert paths
    gone = [p for p in named_paths(readme_layout()) if not exists(p)]
    assert not gone, f"README's code layout names paths that do not exist: {gone}"
    named = {p.split("/")[0].removesuffix(".py") for p in paths}
    assert not top_level() - named, f"README's code layout leaves out {top_level() - named}"


def test_the_map_test_sees_a_stale_room():
    section = ("\n| package | what |\n|---|---|\n| `data/prepare/` | writing |\n\n"
               "Each room imports only the rooms below it (`data/sidecar` <- `data/build`).\n")
    assert layout_paths(section) == ["data/prepare/"]
    assert named_paths(section) == ["data/prepare/", "data/sidecar", "data/build"]
    assert [exists(p) for p in named_paths(section)] == [True, True, False]
