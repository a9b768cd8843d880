"""The EndPrompt ``pretrain`` entry (Megatron-LM style), used on GPU clusters and on a laptop.

    torchrun ... -m megatron_endprompt.training.pretrain <Megatron flags> \\
        --endprompt-target-length L

Flow: ``runtime.install(trainer=True)`` (wheel fixes always, the CPU layer without a GPU, the
child reaper) ->
``parse_and_validate_args`` with our
``--endprompt-*`` flags -> one :class:`~megatron_endprompt.training.run.EndPromptRun` -> check
every data prefix's sidecar against it -> config container -> ``megatron.training.pretrain``
with our dataset provider, model provider and forward step, each made from the run.
"""

from __future__ import annotations

import argparse
import os
import sys

from megatron_endprompt import runtime
from megatron_endprompt.errors import UserError
from megatron_endprompt.training.checks import check_startup, check_transformer_impl, \
    parse_args_checked


def main(argv: list[str] | None = None) -> None:
    """Parse flags, check sidecars, run Megatron's ``pretrain``."""
    runtime.quiet()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # trainer: the launch-queue variable and the child reaper, in the ledger too
        layers = runtime.install(trainer=True)
    except RuntimeError as exc:  # version gate or a changed patched function: one line
        raise SystemExit(f"error: {exc}") from None
    if layers["cpu"]:  # refused before Megatron parses or builds anything
        early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        early.add_argument("--transformer-impl")
        try:
            check_transformer_impl(early.parse_known_args(argv)[0].transformer_impl)
        except UserError as exc:
            raise SystemExit(f"error: {exc}") from None
        argv = runtime.with_cpu_args(argv)

    from megatron.core.enums import ModelType
    from megatron.training import pretrain
    from megatron.training.argument_utils import pretrain_cfg_container_from_args

    from megatron_endprompt.training.cli_args import cli_args_provider
    from megatron_endprompt.training.args import (
        add_endprompt_args,
        check_sidecars,
        loaded_checkpoint_args,
        startup_tokenizer_identity,
    )
    from megatron_endprompt.runtime.versions import call_pretrain
    from megatron_endprompt.training.long_eval import long_eval_hook
    from megatron_endprompt.training.schedule_check import (
        check_schedule_continues,
        check_warmup_fits,
    )
    from megatron_endprompt.training.providers import (
        make_datasets_provider,
        make_forward_step,
        make_model_provider,
    )
    from megatron_endprompt.training.run import (
        build_run,
        long_eval_settings,
        resolve_endprompt_args,
    )

    sys.argv = [sys.argv[0], *argv]
    try:
        # Megatron's asserts -> one line; bad flag values -> one line; --help works
        args = parse_args_checked(argv, cli_args_provider(add_endprompt_args))
        # blends, prefixes (Megatron's PREFIX_text_document spelling resolved), --load, vocab
        # divisor: before Megatron starts
        notes = check_startup(args)
        long_eval_flags = long_eval_settings(args)
        long_eval = long_eval_hook(long_eval_flags, args)  # data read and checked now
        saved = loaded_checkpoint_args(args)
        window = resolve_endprompt_args(args, saved)
        check_schedule_continues(args, saved)  # before Megatron's assertion after loading
        check_warmup_fits(args)  # before its scheduler's assertion after the model build
        # the EndPrompt settings, read once: the providers and hooks get them, not get_args()
        run = build_run(args, window=window, long_eval=long_eval_flags,
                        tokenizer_identity=startup_tokenizer_identity(args))  # once
        layouts = check_sidecars(args, run)
    except UserError as exc:
        # every rank prints its line: torchrun stops the others as soon as one rank exits, so
        # a line printed by rank 0 alone may never be written (the launch script shows it once)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if int(os.environ.get("RANK", "0")) == 0:
        for note in dict.fromkeys([*notes, *run.notes]):
            print(note, flush=True)
        print(f"EndPrompt: {window.banner()} RoPE={run.rope_scaling}; "
              f"{len(layouts)} EndPrompt prefix(es)", flush=True)
        from megatron_endprompt.data.sidecar.sidecar import open_sidecar, sidecar_path
        from megatron_endprompt.data.coverage import coverage_line

        for prefix in layouts:
            path = sidecar_path(prefix, run.sidecar_name)
            line = coverage_line(prefix, open_sidecar(path).header.stats)
            if line:
                print(f"EndPrompt layout coverage: {line}", flush=True)
    if not args.calculate_per_token_loss:
        raise SystemExit("error: EndPrompt needs --calculate-per-token-loss (exact weighted "
                         "normaliser); add the flag")
    cfg = pretrain_cfg_container_from_args(args)
    call_pretrain(pretrain, cfg, make_datasets_provider(run), ModelType.encoder_or_decoder,
                  make_forward_step(run), model_provider=make_model_provider(run),
                  non_loss_data_func=long_eval)


if __name__ == "__main__":
    main()
