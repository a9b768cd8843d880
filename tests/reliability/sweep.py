"""The reliability sweep's harness: run one case, classify it, count.

A case runs a tool on a bad input or under a fault inside its own directory ``d`` (which holds
copies of any previous output the run must not damage). Outcome flags, counted independently:

* ``one_line``: the expected exit code, exactly one ``error:`` line, no traceback, ``d``
  unchanged (for cases that must succeed: exit 0 and the case's own check);
* ``traceback``: ``Traceback`` on stderr or an exception escaping the tool;
* ``partial``: files in ``d`` that were not there before (temporaries, hidden partial dirs,
  lock files, half-written outputs);
* ``wrong_success``: exit 0 where the input must be refused (for the pretrain entry: the run
  reached Megatron's ``pretrain()`` without refusing the input up front);
* ``data_lost``: a file of the previous dataset/checkpoint/export changed or vanished.

``python tests/reliability/sweep.py [RESULTS.json]`` prints the counts (used for the before/after
figures: run it with ``PYTHONPATH`` at the old checkout for "before").
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from tests.support.refusal import tree_digest

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Case:
    """One row of the sweep table."""

    name: str
    tool: str
    """preprocess | inspect | convert | eval | merge | sidecar | plan | pretrain (decides the
    ``main`` that runs) | launch (the bash launcher, through ``run``)."""
    build: Callable[[Any, str], list[str]]
    """``build(fixtures, d) -> argv``; may create inputs and previous outputs in ``d``."""
    rc: int = 2
    """Expected exit code (0: the case must succeed, checked by ``check``)."""
    needle: str = ""
    """Text the ``error:`` line must contain (the flag or file it names)."""
    patch: Callable[[Any, str], Any] | None = None
    """``patch(fixtures, d)`` -> a context manager active while the tool runs (fault)."""
    check: Callable[[Any, str, dict], list[str]] | None = None
    """Extra check after the run; returns outcome flags to raise (``data_lost``, ...)."""
    run: Callable[[Any, str, list[str]], tuple[int | None, str]] | None = None
    """Custom runner (subprocess cases): returns ``(rc, stderr)``."""
    transient: tuple[str, ...] = ()
    """Names in ``d`` a case creates as part of its fault (ignored by the snapshot)."""
    item: str = ""
    """The reliability checklist item the case covers (its number in the sweep report)."""
    extra: dict = field(default_factory=dict)


def snapshot(d: str, ignore: tuple[str, ...] = ()) -> dict[str, str]:
    """``relpath -> content digest`` of everything under ``d`` (hidden entries included), but for
    the top-level names in ``ignore``."""
    return tree_digest(d, ignore)


MAINS = {
    "preprocess": "megatron_endprompt.cli.preprocess",
    "inspect": "megatron_endprompt.cli.inspect",
    "convert": "megatron_endprompt.cli.convert",
    "eval": "megatron_endprompt.cli.eval",
    "merge": "megatron_endprompt.cli.merge",
    "sidecar": "megatron_endprompt.cli.build_sidecar",
    "plan": "megatron_endprompt.cli.plan",
}


def run_in_process(tool: str, argv: list[str], patch=None) -> tuple[int | None, str]:
    """The tool's ``main`` through ``run_cli``; an escaping exception counts as a traceback."""
    import importlib

    from megatron_endprompt.errors import run_cli

    main = importlib.import_module(MAINS[tool]).main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            with patch if patch is not None else contextlib.nullcontext():
                rc = run_cli(main, argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int) and exc.code:
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - that is what we measure
            traceback.print_exc()
            rc = None
    return rc, err.getvalue()


def classify(case: Case, rc: int | None, stderr: str, before: dict, after: dict,
             extra_flags: list[str]) -> dict:
    error_lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    tb = rc is None or "Traceback (most recent call last)" in stderr
    new = sorted(set(after) - set(before))
    changed = sorted(k for k in before if after.get(k) != before[k])
    if case.extra.get("allow_changed"):  # old OR new is right; ``check`` decides
        changed = []
    r = {"name": case.name, "tool": case.tool, "item": case.item, "rc": rc,
         "error_lines": error_lines, "traceback": tb, "new_files": new, "changed": changed,
         "stderr_tail": stderr[-600:]}
    if case.rc == 0:
        r["wrong_success"] = False
        r["partial"] = "partial" in extra_flags
        r["data_lost"] = "data_lost" in extra_flags
        r["one_line"] = rc == 0 and not tb and not extra_flags
    else:
        r["wrong_success"] = rc == 0 or "wrong_success" in extra_flags
        # a wrong success is counted as that only (its outputs are complete, just wrong)
        r["partial"] = (bool(new) and not r["wrong_success"]) or "partial" in extra_flags
        r["data_lost"] = (bool(changed) and not r["wrong_success"]) or "data_lost" in extra_flags
        r["one_line"] = (rc == case.rc and not tb and len(error_lines) == 1
                         and case.needle in error_lines[0] and not r["partial"]
                         and not r["data_lost"] and not r["wrong_success"])
    return r


def run_case(case: Case, fx: Any, root: str) -> dict:
    d = os.path.join(root, case.name)
    os.makedirs(d)
    argv = case.build(fx, d)
    before = snapshot(d, case.transient)
    patch = case.patch(fx, d) if case.patch else None
    if case.run is not None:
        rc, stderr = case.run(fx, d, argv)
    else:
        rc, stderr = run_in_process(case.tool, argv, patch)
    after = snapshot(d, case.transient)
    flags = case.check(fx, d, {"rc": rc, "stderr": stderr}) if case.check else []
    if case.rc == 0:
        new_tmp = [k for k in set(after) - set(before)
                   if ".tmp-" in k or ".partial-" in k or k.endswith((".lock", ".commit"))]
        if new_tmp:
            flags = [*flags, "partial"]
    return classify(case, rc, stderr, before, after, flags)


COUNT_KEYS = ("one_line", "traceback", "partial", "wrong_success", "data_lost")


@contextlib.contextmanager
def raise_in(module: str, attr: str, exc: BaseException):
    """Make ``module.attr`` (``attr`` may be ``Class.method``) raise ``exc`` for the duration:
    the fault a case injects (a full disk, a crash inside a step)."""
    import importlib

    mod = importlib.import_module(module)
    obj, name = mod, attr
    if "." in attr:
        cls, name = attr.split(".")
        obj = getattr(mod, cls)
    saved = getattr(obj, name)

    def boom(*a, **k):
        raise exc

    setattr(obj, name, boom)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def counts(results: list[dict]) -> dict[str, int]:
    out = {"tried": len(results)}
    for key in COUNT_KEYS:
        out[key] = sum(bool(r[key]) for r in results)
    return out


def run_sweep(root: str | None = None, *, names: set[str] | None = None) -> list[dict]:
    """Build the fixtures and run every case (pretrain cases in one subprocess)."""
    sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the cases and tests/ helpers
    import sweep_cases
    import sweep_fixtures

    root = root or tempfile.mkdtemp(prefix="endprompt-sweep-")
    fx = sweep_fixtures.build(os.path.join(root, "fixtures"))
    results = []
    cases = [c for c in sweep_cases.CASES if names is None or c.name in names]
    results += sweep_cases.run_pretrain_cases([c for c in cases if c.tool == "pretrain"], fx,
                                              os.path.join(root, "cases"))
    for case in cases:
        if case.tool != "pretrain":
            results.append(run_case(case, fx, os.path.join(root, "cases")))
    return results


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = run_sweep()
    if len(sys.argv) > 1:  # sweep.py RESULTS.json: keep every case's outcome
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=1)
    for r in res:
        if not r["one_line"]:
            flags = [k for k in COUNT_KEYS[1:] if r[k]]
            print(f"NOT CLEAN {r['name']}: rc={r['rc']} {flags} errors={r['error_lines'][:2]} "
                  f"new={r['new_files'][:3]} changed={r['changed'][:3]}\n    "
                  + r["stderr_tail"].strip().splitlines()[-1:].__str__())
    print(json.dumps(counts(res)))
