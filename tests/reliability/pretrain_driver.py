"""Run the pretrain entry's start-up on many argv lists in ONE process (Megatron imported once).

``python pretrain_driver.py CASES.json RESULTS.json``: for each ``{"name", "argv", "env"}``
(``env``: variables set for that case only, e.g. torchrun's ``WORLD_SIZE``) calls
``megatron_endprompt.training.pretrain.main(argv)`` with Megatron's ``pretrain()`` replaced by
a stub that records that the run got that far (no training is launched). Records the exit
code, stderr and whether Megatron's ``pretrain()`` was reached.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback


class _Reached(BaseException):
    pass


def _stub(*args, **kwargs):
    raise _Reached()


def _reset_megatron_globals() -> None:
    """Each case parses its own args (Megatron refuses a second initialisation otherwise)."""
    from megatron.training import global_vars

    global_vars.unset_global_variables()
    try:
        from megatron.core import num_microbatches_calculator as nmc

        nmc.destroy_num_microbatches_calculator()
    except (ImportError, AttributeError):
        pass


def main() -> None:
    import megatron.training

    from megatron_endprompt.training import pretrain as entry

    cases_path, results_path = sys.argv[1], sys.argv[2]  # the entry rewrites sys.argv
    with open(cases_path) as f:
        cases = json.load(f)
    results = []
    for case in cases:
        _reset_megatron_globals()
        megatron.training.pretrain = _stub
        err = io.StringIO()
        reached = False
        saved_env = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))  # e.g. WORLD_SIZE: what torchrun would set
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                entry.main(case["argv"])
                rc = 0
            except _Reached:
                reached, rc = True, 0
            except SystemExit as exc:
                if isinstance(exc.code, int) or exc.code is None:
                    rc = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    rc = 1
            except BaseException:  # noqa: BLE001 - a traceback is an outcome
                traceback.print_exc()
                rc = None
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        results.append({"name": case["name"], "rc": rc, "stderr": err.getvalue(),
                        "reached": reached})
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
