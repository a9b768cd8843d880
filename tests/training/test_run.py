"""``EndPromptRun``: the EndPrompt flags read once at start-up and handed to the providers, the
forward step and the long-eval hook, so nothing reads them back from Megatron's ``get_args()``."""

from __future__ import annotations

import argparse
import ast
import pathlib

import pytest

from megatron_endprompt.errors import UserError
from megatron_endprompt.training.args import add_endprompt_args
from megatron_endprompt.training.run import EndPromptRun, build_run, resolve_endprompt_args

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "megatron_endprompt"

#: The one module that reads the EndPrompt flags of a live run.
BUILDER = "training/run.py"

#: Readers of a *saved* checkpoint's ``args`` (the reason ``args`` keeps ``L0``, ``s``, the RoPE
#: scaling and the HF config): the export, not a training run.
CHECKPOINT_READERS = {"conversion/families.py", "conversion/hf_config.py",
                      "conversion/megatron_to_hf.py", "model/yarn.py:yarn_from_megatron_args"}


def _is_args(node: ast.AST) -> bool:
    """A Megatron args namespace: a name ending in ``args`` or a ``get_args()`` call."""
    if isinstance(node, ast.Name):
        return node.id.endswith("args")
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "get_args"


def _reads(tree: ast.AST):
    """``(function, line, attribute)`` of each ``args.endprompt_*`` /
    ``getattr(args, "endprompt_*")`` read in ``tree``."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if (isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load)
                    and child.attr.startswith("endprompt_") and _is_args(child.value)):
                yield name, child.lineno, child.attr
            elif (isinstance(child, ast.Call) and getattr(child.func, "id", None)
                  in ("getattr", "hasattr") and len(child.args) >= 2
                  and isinstance(child.args[1], ast.Constant)
                  and str(child.args[1].value).startswith("endprompt_")
                  and _is_args(child.args[0])):
                yield name, child.lineno, child.args[1].value
            yield from walk(child, name)
    yield from walk(tree, "")


def endprompt_flag_reads() -> list[str]:
    """Every read of an EndPrompt flag from Megatron args outside the builder and the
    checkpoint readers, as ``module:line attribute``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == BUILDER or module in CHECKPOINT_READERS:
            continue
        for function, line, attr in _reads(ast.parse(path.read_text(encoding="utf-8"))):
            if f"{module}:{function}" not in CHECKPOINT_READERS:
                found.append(f"{module}:{line} {attr}")
    return found


def test_only_the_run_builder_reads_endprompt_flags_from_megatron_args():
    """Before ``EndPromptRun`` the providers, the long-eval hook, the forward step, the start-up
    checks and the window read them back (31 reads in 6 modules)."""
    assert endprompt_flag_reads() == []


#: Modules that may name an EndPrompt flag's attribute as a string: where the flags are defined
#: and the dataset config's cache key (the config's own fields, filled from ``EndPromptRun``).
NAMED_BY_STRING = {"training/args.py", "data/dataset.py"}


def endprompt_flag_names() -> list[str]:
    """Every string constant that names an EndPrompt flag's attribute (``"endprompt_x"``, as a
    dynamic ``getattr``/``setattr`` would use it) outside the builder, the flags' definition,
    the dataset config's cache key and the checkpoint readers, as ``module:line name``."""
    dests = {a.dest for a in add_endprompt_args(argparse.ArgumentParser())._actions
             if a.dest.startswith("endprompt_")}
    readers = {m.split(":")[0] for m in CHECKPOINT_READERS}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == BUILDER or module in NAMED_BY_STRING or module in readers:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in dests:
                found.append(f"{module}:{node.lineno} {node.value}")
    return found


def test_no_other_module_names_an_endprompt_flag_by_string():
    """The literal-attribute lint above cannot see ``setattr(args, attr, ...)`` over a tuple of
    names: the start-up checks rewrote ``endprompt_replay_prefixes`` that way (the replay
    prefixes are now resolved in the builder)."""
    assert endprompt_flag_names() == []


def test_the_lint_sees_both_spellings():
    tree = ast.parse("def f(args):\n    a = args.endprompt_x\n"
                     "    b = getattr(get_args(), 'endprompt_y', None)\n"
                     "    args.endprompt_z = 1\n    c = config.endprompt_w\n")
    assert [(f, a) for f, _, a in _reads(tree)] == [("f", "endprompt_x"), ("f", "endprompt_y")]


def _parse(*argv):
    ns = add_endprompt_args(argparse.ArgumentParser()).parse_args(
        ["--endprompt-target-length", "65536", *map(str, argv)])
    ns.seq_length, ns.max_position_embeddings = 4096, 8192
    ns.rotary_seq_len_interpolation_factor = None
    ns.load = ns.pretrained_checkpoint = None
    ns.data_path = ["mg/a", "mg/b"]
    return ns


def test_run_holds_what_the_providers_read():
    args = _parse("--endprompt-sidecar-name", "prompt", "--endprompt-loss-log", "/tmp/log",
                  "--endprompt-replay-prefixes", "./mg/b", "--endprompt-terminal-loss-weight",
                  "0.5")
    run = build_run(args, window=resolve_endprompt_args(args))
    assert isinstance(run, EndPromptRun)
    assert (run.window.target_length, run.window.original_length, run.window.pi_factor) \
        == (65536, 8192, 8.0)
    assert run.window.loss_weights.terminal == 0.5
    assert (run.sidecar_name, run.loss_log, run.replay_prefixes) == ("prompt", "/tmp/log",
                                                                      ("mg/b",))
    assert run.long_eval is None and run.yarn is None
    with pytest.raises(AttributeError):
        run.loss_log = None  # frozen: what was checked is what the providers use
    # args keeps what checkpoints save: the resolved L0 and s
    assert (args.endprompt_original_length, args.endprompt_pi_factor) == (8192, 8.0)


@pytest.mark.parametrize("replay, needle", [("mg/c", "not one of the data prefixes"),
                                            ("mg/a/", "drop the trailing '/'")])
def test_unknown_replay_prefix_is_one_line(replay, needle):
    args = _parse("--endprompt-replay-prefixes", replay)
    with pytest.raises(UserError, match=needle):
        build_run(args, window=resolve_endprompt_args(args))
