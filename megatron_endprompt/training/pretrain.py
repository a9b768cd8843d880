"""The EndPrompt ``pretrain`` entry (Megatron-LM style), used on GPU clusters and on a laptop.

    torchrun ... -m megatron_endprompt.training.pretrain <Megatron flags> --endprompt-target-length L

Flow: ``runtime.install()`` (wheel fixes always, the CPU layer without a GPU) ->
``parse_and_validate_args`` with our
``--endprompt-*`` flags -> check every data prefix's sidecar against them -> config container
-> ``megatron.training.pretrain`` with our dataset provider, model provider and forward step.
"""

from __future__ import annotations

import os
import sys

def _with_cpu_flags(argv: list[str]) -> list[str]:
    """Prepend the runtime's CPU flags (local layer spec, no CUDA fusions) the user did not set."""
    from megatron_endprompt.runtime import CPU_ARGS as CPU_FLAGS

    present = set(a.split("=")[0] for a in argv if a.startswith("--"))
    extra: list[str] = []
    i = 0
    while i < len(CPU_FLAGS):
        flag = CPU_FLAGS[i]
        takes_value = i + 1 < len(CPU_FLAGS) and not CPU_FLAGS[i + 1].startswith("--")
        if flag not in present:
            extra += CPU_FLAGS[i:i + 1 + takes_value]
        i += 1 + takes_value
    return extra + argv


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The last value given for ``flag`` (``--flag v`` or ``--flag=v``), or ``None``."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def _check_cpu_argv(argv: list[str]) -> None:
    """Without CUDA, Transformer Engine's layers cannot run (installed or not): refuse the flag
    that asks for them in one line instead of failing inside the model build or first step."""
    if _flag_value(argv, "--transformer-impl") == "transformer_engine":
        raise SystemExit("error: --transformer-impl transformer_engine needs a CUDA GPU "
                         "(Transformer Engine's layers do not run on CPU); drop the flag: "
                         "the CPU runtime uses --transformer-impl local")


def main(argv: list[str] | None = None) -> None:
    """Parse flags, check sidecars, run Megatron's ``pretrain``."""
    from megatron_endprompt.compat import quiet_megatron_import_noise

    quiet_megatron_import_noise()
    import torch

    from megatron_endprompt import runtime
    from megatron_endprompt.errors import UserError
    from megatron_endprompt.runtime.child_death import install_child_reaper

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        layers = runtime.install()
    except RuntimeError as exc:  # version gate or a changed patched function: one line
        raise SystemExit(f"error: {exc}") from None
    install_child_reaper()  # checkpoint-writer children exit with this rank
    if layers["cpu"]:
        _check_cpu_argv(argv)
        argv = _with_cpu_flags(argv)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")

    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args

    from megatron_endprompt.training.cli_args import cli_args_provider
    from megatron_endprompt.training.args import (
        add_endprompt_args,
        check_sidecars,
        loaded_checkpoint_args,
        resolve_endprompt_args,
    )
    from megatron_endprompt.training.checks import check_startup, parse_args_checked
    from megatron_endprompt.runtime.versions import call_pretrain
    from megatron_endprompt.training.long_eval import long_eval_hook
    from megatron_endprompt.training.providers import (
        datasets_provider,
        forward_step,
        model_provider,
    )

    sys.argv = [sys.argv[0], *argv]
    try:
        # Megatron's asserts -> one line; bad flag values -> one line; --help works
        args = parse_args_checked(argv, cli_args_provider(add_endprompt_args))
        check_startup(args)  # blends, prefixes, --load, vocab divisor: before Megatron starts
        long_eval = long_eval_hook(args)  # its data read and checked now, not mid-training
        window = resolve_endprompt_args(args, loaded_checkpoint_args(args))
        layouts = check_sidecars(args)
    except UserError as exc:
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"EndPrompt: {window.banner()} RoPE={args.endprompt_rope_scaling}; "
              f"{len(layouts)} EndPrompt prefix(es)", flush=True)
        from megatron_endprompt.data.sidecar import open_sidecar, sidecar_path
        from megatron_endprompt.training.startup_summary import coverage_line

        for prefix in layouts:
            path = sidecar_path(prefix, getattr(args, "endprompt_sidecar_name", None))
            line = coverage_line(prefix, open_sidecar(path).header.stats)
            if line:
                print(f"EndPrompt layout coverage: {line}", flush=True)
    if not args.calculate_per_token_loss:
        raise SystemExit("error: EndPrompt needs --calculate-per-token-loss (exact weighted "
                         "normaliser); add the flag")
    cfg = pretrain_cfg_container_from_args(args)
    call_pretrain(pretrain, cfg, datasets_provider, ModelType.encoder_or_decoder, forward_step,
                  model_provider=model_provider, non_loss_data_func=long_eval)


if __name__ == "__main__":
    main()
