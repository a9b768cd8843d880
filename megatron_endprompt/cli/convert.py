"""``tools/convert_checkpoint.py``: HF Llama <-> Megatron-Core ``torch_dist`` checkpoints.

    convert_checkpoint.py hf-to-megatron --hf-dir DIR --output DIR
        [--tensor-parallel-size N] [--pipeline-parallel-size N] [--overwrite]
    convert_checkpoint.py megatron-to-hf --checkpoint DIR --output DIR
        [--tokenizer PATH] [--target-length L] [--pi-factor s] [--overwrite]

Bad input (missing or partial HF directory, non-Llama model, shapes that disagree with the
config, no checkpoint, ``L`` not above the original window, an existing output) is reported as
one ``error:`` line, exit status 2, and no output directory is left behind.
"""

from __future__ import annotations

import argparse
import shlex

from megatron_endprompt import runtime
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="convert_checkpoint.py",
        description="Convert checkpoints between Hugging Face Llama and Megatron-Core "
                    "torch_dist (EndPrompt-aware: exported configs carry L and s).")
    sub = p.add_subparsers(dest="command", required=True)
    h = sub.add_parser("hf-to-megatron", help="HF Llama directory -> Megatron torch_dist")
    h.add_argument("--hf-dir", required=True, help="HF model directory (config.json + "
                   "safetensors, sharded or not)")
    h.add_argument("--output", required=True, help="Megatron checkpoint directory to create "
                   "(pass it to pretrain as --pretrained-checkpoint DIR --load SAVE_DIR)")
    h.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="TP of the training run: the vocabulary is padded to a multiple of "
                        "--make-vocab-size-divisible-by x TP, as Megatron does (default 1)")
    h.add_argument("--pipeline-parallel-size", type=int, default=1,
                   help="PP of the training run (validated and recorded; weights reshard)")
    h.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="Megatron's flag of the same name (default 128)")
    m = sub.add_parser("megatron-to-hf", help="Megatron torch_dist checkpoint -> HF Llama")
    m.add_argument("--checkpoint", required=True, help="Megatron save directory (follows "
                   "latest_checkpointed_iteration.txt) or an iter_*/release directory")
    m.add_argument("--output", required=True, help="HF directory to create")
    m.add_argument("--tokenizer", default=None, help="HF tokenizer directory, tokenizer.json or "
                   "SentencePiece .model (default: the training run's --tokenizer-model)")
    m.add_argument("--target-length", type=int, default=None,
                   help="L: max_position_embeddings of the export (default: the run's "
                        "--endprompt-target-length)")
    m.add_argument("--lora-format", choices=("merged", "peft"), default="merged",
                   help="a LoRA run's adapters: 'merged' into the weights (a plain HF model, "
                   "default) or 'peft' (adapter_config.json + adapter_model.safetensors that HF "
                   "peft loads onto the original HF model, with this directory's config.json)")
    m.add_argument("--pi-factor", type=float, default=None,
                   help="s: linear RoPE scaling factor (default: the run's "
                        "--endprompt-pi-factor, else ceil(L / L0))")
    for q in (h, m):
        q.add_argument("--overwrite", action="store_true", help="replace an existing --output")
        q.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime.quiet(checkpoints=True)
    runtime.import_megatron_eager(("megatron_endprompt.conversion",))  # no-op with CUDA
    if args.command == "hf-to-megatron":
        if args.make_vocab_size_divisible_by < 1:
            raise UserError(f"--make-vocab-size-divisible-by {args.make_vocab_size_divisible_by} "
                            "must be >= 1 (Megatron's default is 128)")
        # lazy: spares torch and Megatron at start-up (--help, the flag checks above)
        from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron

        summary = convert_hf_to_megatron(HFToMegatronOptions(
            hf_dir=args.hf_dir, output=args.output,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            make_vocab_size_divisible_by=args.make_vocab_size_divisible_by,
            overwrite=args.overwrite, progress=not args.no_progress))
        print(f"wrote {summary['checkpoint']} ({summary['tensors']} tensors, {summary['dtype']}, "
              f"vocabulary {summary['vocab_size']} padded to {summary['padded_vocab_size']})")
        print("train from it: CHECKPOINT_IN=" + shlex.quote(summary["output"])
              + " bash examples/pretrain_llama3_endprompt.sh (the launcher takes the model from "
              "the conversion record beside it, which lists its Megatron flags for other "
              "launchers)")
        return 0
    # lazy: spares torch and Megatron at start-up (--help, the flag checks below)
    from megatron_endprompt.conversion import MegatronToHFOptions, convert_megatron_to_hf

    if args.target_length is not None and args.target_length <= 0:
        raise UserError(f"--target-length {args.target_length} must be positive")
    summary = convert_megatron_to_hf(MegatronToHFOptions(
        checkpoint=args.checkpoint, output=args.output, tokenizer=args.tokenizer,
        target_length=args.target_length, pi_factor=args.pi_factor,
        overwrite=args.overwrite, progress=not args.no_progress, lora_format=args.lora_format))
    lora = summary["lora"]
    if lora is not None:
        print(f"LoRA adapters (r={lora['rank']}, alpha={lora['alpha']:g}): "
              + ("merged into the weights" if lora["format"] == "merged" else
                 "written for PEFT (adapter_config.json, adapter_model.safetensors)"))
    print(f"wrote {summary['output']} from {summary['checkpoint']}: "
          f"{len(summary['shards'])} shard(s), max_position_embeddings={summary['target_length']}"
          f" (original {summary['original_length']}), linear RoPE factor "
          f"{summary['pi_factor']:g}, rope_theta {summary['rope_theta']:g}, vocabulary "
          f"{summary['vocab_size']} ({summary['vocab_from']}), tokenizer: "
          f"{summary['tokenizer'] or 'none (pass --tokenizer)'}")
    return 0


cli = entry(main)


if __name__ == "__main__":
    cli()
