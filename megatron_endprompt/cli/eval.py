"""``tools/eval_longcontext.py``: passkey / NIAH / perplexity of an HF causal LM at several
context lengths; writes ``FILE.json``, ``FILE.md``, ``FILE_niah.png`` and ``FILE_ppl.png``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from typing import Any

from megatron_endprompt.errors import UserError, run_cli

TASK_GROUPS = {"niah": ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")}
TASK_NAMES = ("passkey", "niah", *TASK_GROUPS["niah"], "ppl")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_longcontext.py",
        description="Long-context evaluation of an HF causal LM directory: passkey retrieval, "
                    "RULER-style needle-in-a-haystack and sliding-window perplexity.")
    p.add_argument("--hf-dir", required=True, help="HF model directory (config, weights, "
                                                   "tokenizer); read from disk only")
    p.add_argument("--tasks", default="passkey,niah",
                   help="comma list of passkey, niah (= the four niah_* variants), niah_single, "
                        "niah_multikey, niah_multivalue, niah_multiquery, ppl "
                        "(default: passkey,niah)")
    p.add_argument("--lengths", required=True,
                   help="comma list of prompt lengths in tokens, e.g. 1024,2048 or 4k,8k")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--depths", default=None,
                   help="comma list of needle depths in [0, 1] (default: 0,0.25,0.5,0.75,1)")
    g.add_argument("--num-depths", type=int, default=None,
                   help="N evenly spaced depths from 0 to 1 instead of --depths")
    p.add_argument("--samples", type=int, default=5, help="prompts per task x length x depth")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if "
                                                  "available, else cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--batch-size", type=int, default=1, help="prompts / PPL windows per batch")
    p.add_argument("--max-new-tokens", type=int, default=0,
                   help="generation budget; 0 = answer length + 6 tokens per prompt")
    p.add_argument("--haystack", choices=("essay", "repeat"), default="essay",
                   help="NIAH haystack: generated essay-like sentences or the passkey filler")
    p.add_argument("--ppl-data", default=None, help="a .txt or .jsonl file for --tasks ppl")
    p.add_argument("--ppl-key", default="text", help="JSONL text field (default: text)")
    p.add_argument("--ppl-stride", type=int, default=256,
                   help="sliding-window stride in tokens (default: 256, as LongLoRA)")
    p.add_argument("--ppl-max-windows", type=int, default=0,
                   help="at most N windows per length, evenly spread; 0 = all")
    p.add_argument("--attn-implementation", default=None,
                   help="passed to from_pretrained, e.g. sdpa, eager, flash_attention_2")
    p.add_argument("--output", required=True, help="FILE.json; FILE.md and FILE_*.png go "
                                                   "beside it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _parse_lengths(text: str) -> list[int]:
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"(\d+)([kK]?)", item)
        if not m or int(m.group(1)) == 0:
            raise UserError(f"--lengths: {item!r} is not a positive token count (e.g. 2048 "
                            "or 2k)")
        out.append(int(m.group(1)) * (1024 if m.group(2) else 1))
    if not out:
        raise UserError("--lengths: give at least one length, e.g. --lengths 1024,2048")
    return list(dict.fromkeys(out))


def _parse_depths(args: argparse.Namespace) -> list[float]:
    if args.num_depths is not None:
        if args.num_depths < 1:
            raise UserError("--num-depths must be >= 1")
        n = args.num_depths
        return [0.5] if n == 1 else [round(i / (n - 1), 6) for i in range(n)]
    out = []
    for item in filter(None, (t.strip() for t in (args.depths or "0,0.25,0.5,0.75,1")
                              .split(","))):
        try:
            d = float(item)
        except ValueError:
            raise UserError(f"--depths: {item!r} is not a number in [0, 1]") from None
        if not 0.0 <= d <= 1.0:
            raise UserError(f"--depths: {item} is outside [0, 1]")
        out.append(d)
    if not out:
        raise UserError("--depths: give at least one depth")
    return list(dict.fromkeys(out))


def _parse_tasks(text: str) -> list[str]:
    out: list[str] = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        if item not in TASK_NAMES:
            raise UserError(f"--tasks: unknown task {item!r}; choose from "
                            f"{', '.join(TASK_NAMES)}")
        out.extend(TASK_GROUPS.get(item, (item,)))
    if not out:
        raise UserError("--tasks: give at least one task")
    return list(dict.fromkeys(out))


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise UserError(f"--device {name}: use cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available here; use --device cpu")
    return name


def _model_config(hf_dir: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"--hf-dir {hf_dir}: cannot read config.json ({exc})") from None


def _check_weights_readable(hf_dir: str) -> None:
    """Open every ``*.safetensors`` header (memory-mapped, no tensor read): a truncated or
    corrupt file is one line naming it, not a ``SafetensorError`` traceback at load time."""
    from safetensors import safe_open

    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            path = os.path.join(hf_dir, name)
            try:
                with safe_open(path, framework="pt"):
                    pass
            except Exception as exc:  # noqa: BLE001 - SafetensorError has no public base
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise UserError(f"--hf-dir {hf_dir}: {name} is truncated or corrupt ({first}); "
                                "re-download or re-export it") from None


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tasks = _parse_tasks(args.tasks)
    lengths = _parse_lengths(args.lengths)
    depths = _parse_depths(args)
    for flag, value, low in (("--samples", args.samples, 1), ("--batch-size", args.batch_size, 1),
                             ("--ppl-stride", args.ppl_stride, 1),
                             ("--max-new-tokens", args.max_new_tokens, 0),
                             ("--ppl-max-windows", args.ppl_max_windows, 0)):
        if value < low:
            raise UserError(f"{flag} must be >= {low} (got {value})")
    if not os.path.isdir(args.hf_dir):
        raise UserError(f"--hf-dir {args.hf_dir}: no such directory")
    if not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        raise UserError(f"--hf-dir {args.hf_dir}: no config.json; give an HF model directory "
                        "(e.g. the converter's output)")
    if "ppl" in tasks and not args.ppl_data:
        raise UserError("--tasks ppl needs --ppl-data FILE (.txt or .jsonl)")
    if args.output.endswith((".md", ".png")):
        raise UserError(f"--output {args.output}: give the JSON path (FILE.json)")
    from megatron_endprompt.evaluation import report, results_io

    # before the model loads, not after the whole evaluation ran
    results_io.check_writable(report.output_paths(args.output)["json"])
    device = _device(args.device)
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")

    import transformers

    from megatron_endprompt.evaluation import report, runner
    from megatron_endprompt.evaluation import tasks as tasks_mod

    transformers.logging.set_verbosity_error()  # our own warnings say what matters
    transformers.logging.disable_progress_bar()

    config = _model_config(args.hf_dir)
    _check_weights_readable(args.hf_dir)  # a truncated download: one line, before any work
    tokenizer = runner.load_tokenizer(args.hf_dir)
    tokens = tasks_mod.PromptTokens(tokenizer)
    retrieval = [t for t in tasks if t != "ppl"]
    for task in retrieval:
        overhead = tasks_mod.prompt_overhead(task, tokens)
        short = [n for n in lengths if n <= overhead]
        if short:
            raise UserError(f"--lengths {','.join(map(str, short))}: too short for {task}, "
                            f"whose prompt without haystack takes {overhead} tokens; give "
                            f"lengths > {overhead}")
    mpe = getattr(config, "max_position_embeddings", None)
    long = [n for n in lengths if mpe and n > mpe]
    if long:
        print(f"warning: --lengths {','.join(map(str, long))} exceed the model's "
              f"max_position_embeddings ({mpe}); evaluating anyway", file=sys.stderr)

    ppl_tokens = None
    ppl_lengths: list[int] = []
    if "ppl" in tasks:
        ppl_tokens = runner.load_ppl_tokens(args.ppl_data, tokenizer, key=args.ppl_key)
        ppl_lengths = [n for n in lengths if len(ppl_tokens) > n]
        if not ppl_lengths:
            raise UserError(f"--ppl-data {args.ppl_data}: {len(ppl_tokens)} tokens, fewer than "
                            f"the shortest length + 1 ({min(lengths) + 1}); give more text")
        skipped = [n for n in lengths if n not in ppl_lengths]
        if skipped:
            print(f"warning: --ppl-data has {len(ppl_tokens)} tokens; no perplexity at "
                  f"lengths {','.join(map(str, skipped))}", file=sys.stderr)

    fillers: dict[str, Any] = {}
    samples = []
    for task in retrieval:
        made = tasks_mod.make_samples(task, tokens, lengths=lengths, depths=depths,
                                      samples=args.samples, seed=args.seed,
                                      haystack=None if task == "passkey" else args.haystack,
                                      fillers=fillers)
        if args.max_new_tokens:
            made = [dataclasses.replace(s, max_new_tokens=args.max_new_tokens) for s in made]
        samples.extend(made)
    n_windows = {n: len(runner.window_starts(len(ppl_tokens), n, args.ppl_stride,
                                             args.ppl_max_windows or None))
                 for n in ppl_lengths} if ppl_tokens is not None else {}

    import torch
    from tqdm import tqdm

    torch.manual_seed(args.seed)
    start = time.time()
    model = runner.load_model(args.hf_dir, device=device, dtype=dtype,
                              attn_implementation=args.attn_implementation)
    results: dict[str, Any] = {"meta": {
        "hf_dir": args.hf_dir, "tasks": tasks, "lengths": lengths, "depths": depths,
        "samples": args.samples, "seed": args.seed, "device": device, "dtype": dtype,
        "batch_size": args.batch_size, "haystack": args.haystack,
        "model_type": getattr(config, "model_type", None), "max_position_embeddings": mpe,
        "rope": _jsonable(getattr(config, "rope_parameters", None)
                          or {"rope_theta": getattr(config, "rope_theta", None),
                              "rope_scaling": getattr(config, "rope_scaling", None)}),
    }}
    with tqdm(total=len(samples) + sum(n_windows.values()), disable=args.no_progress,
              desc="eval", unit="item", file=sys.stderr, dynamic_ncols=True) as bar:
        json_path = report.output_paths(args.output)["json"]
        if samples:
            bar.set_description("retrieval")
            records: list[dict[str, Any]] = []
            groups: dict[tuple[str, int], list[Any]] = {}
            for s in samples:
                groups.setdefault((s.task, s.length), []).append(s)
            for group in groups.values():  # results on disk as each task/length finishes
                records += runner.run_retrieval(model, tokenizer, group,
                                                batch_size=args.batch_size, progress=bar)
                results["retrieval"] = report.summarize_retrieval(records)
                results_io.write_json_now(results, json_path)
        if ppl_tokens is not None:
            by_length: dict[str, Any] = {str(n): None for n in lengths}
            for n in ppl_lengths:
                bar.set_description(f"ppl@{n}")
                stats = runner.run_perplexity(model, ppl_tokens, length=n,
                                              stride=args.ppl_stride,
                                              batch_size=args.batch_size,
                                              max_windows=args.ppl_max_windows or None,
                                              progress=bar)
                by_length[str(n)] = stats.as_dict()
                results["ppl"] = {"data": args.ppl_data, "data_tokens": int(len(ppl_tokens)),
                                  "stride": args.ppl_stride,
                                  "max_windows": args.ppl_max_windows or None,
                                  "by_length": by_length}
                results_io.write_json_now(results, json_path)
    results["meta"]["elapsed_s"] = round(time.time() - start, 2)
    written = report.write_reports(results, args.output)
    print(report.markdown_table(results))
    print("wrote " + ", ".join(written))
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(run_cli(main))


if __name__ == "__main__":
    cli()
