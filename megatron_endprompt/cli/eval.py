"""``tools/eval_longcontext.py``: RULER, passkey, perplexity, LongBench, short-text retention (or
any lm-eval task) of an HF causal LM at several context lengths; writes ``FILE.json``,
``FILE.md``, ``FILE_niah.png`` and ``FILE_ppl.png``. Parses flags into ``EvalConfig`` and
prints; the pipeline is ``megatron_endprompt.evaluation.suite.evaluate``."""

from __future__ import annotations

import argparse
import re

from megatron_endprompt.cli.kit import entry
from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.config import MAX_DEPTHS
from megatron_endprompt.evaluation.report.tables import markdown_table
from megatron_endprompt.evaluation.suite import EvalConfig, evaluate, resolve_tasks
from megatron_endprompt.evaluation.task_table import task_names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval_longcontext.py",
        description="Long-context evaluation of an HF causal LM directory, offline from local "
                    "files: RULER's 11 synthetic tasks (exact where they need no download) and "
                    "qa_1/qa_2 (--qa-dir), passkey retrieval (landmark attention / PoSE), "
                    "per-document sliding-window perplexity (--ppl-data), LongBench and "
                    "LongBench-E (--longbench-dir), short-text retention: MMLU, GSM8K, "
                    "HellaSwag through lm-eval and HumanEval pass@1 (--short-text-dir); or any "
                    "lm-evaluation-harness task (--backend lm-eval). Every score is on a 0-100 "
                    "scale; the markdown states the items behind each number and whether it "
                    "may stand beside the EndPrompt paper's.")
    p.add_argument("--hf-dir", required=True, help="HF model directory (config, weights, "
                                                   "tokenizer); read from disk only")
    p.add_argument("--tasks", default="ruler",
                   help="comma list of: ruler (all 11 synthetic RULER tasks), ruler_niah, "
                        "niah_single_1..3, niah_multikey_1..3, niah_multivalue, "
                        "niah_multiquery, vt, cwe, fwe, qa_1, qa_2 (need --qa-dir), ruler13 "
                        "(all 13), passkey, ppl; legacy / legacy_* = the old pre-RULER "
                        "prompts; none (only --longbench-dir / --short-text-dir) "
                        "(default: ruler). With --backend lm-eval: any lm-eval task, group or "
                        "tag (e.g. niah_single_1,mmlu), or a local task under --lm-eval-include. "
                        "Every name (the task table's): " + ", ".join(task_names()))
    p.add_argument("--lengths", required=True,
                   help="comma list of lengths in tokens (prompt + generated tokens), e.g. "
                        "4096,8192 or 4k,8k")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--depths", default=None,
                   help="passkey needle depths in [0, 1] (default: 0,0.25,0.5,0.75,1); also "
                        "the heatmap's rows")
    g.add_argument("--num-depths", type=int, default=None,
                   help="N evenly spaced depths from 0 to 1 instead of --depths")
    p.add_argument("--samples", type=int, default=None,
                   help="prompts per task x length (x depth for passkey; default 5); RULER "
                        "uses 500. With --backend lm-eval: documents per task (per task x "
                        "length for RULER tasks; default: all)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the native tasks' prompts (default 42, RULER's) and of lm-eval "
                        "(short text, --backend lm-eval; default: lm-eval's own seeds 0 / 1234 / "
                        "1234 / 1234, which draw lm-eval's few-shot examples)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if "
                                                  "available, else cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--batch-size", type=int, default=1, help="prompts per generate call")
    p.add_argument("--haystack", default=None,
                   help="essay haystack for niah_single_2/3, niah_multikey_1, "
                        "niah_multivalue, niah_multiquery: RULER's PaulGrahamEssays.json or a "
                        ".txt file (default: the shipped public-domain substitute, labelled "
                        "'substitute haystack')")
    p.add_argument("--ppl-data", default=None,
                   help="PG19-style .jsonl (one document per line) or one .txt document")
    p.add_argument("--ppl-key", default="text", help="JSONL text field (default: text)")
    p.add_argument("--ppl-stride", type=int, default=256,
                   help="sliding-window stride in tokens (default: 256)")
    p.add_argument("--ppl-doc-tokens", type=int, default=0,
                   help="score only the first N tokens of each document (0 = all)")
    p.add_argument("--ppl-max-windows", type=int, default=0,
                   help="at most N windows per length, evenly spread; 0 = all")
    p.add_argument("--ppl-protocol", choices=("document", "legacy-stream"), default="document",
                   help="document (PoSE/LongLoRA: per document, BOS, new tokens only) or "
                        "legacy-stream (the old EOS-joined stream, for old results)")
    p.add_argument("--attn-implementation", default=None,
                   help="passed to from_pretrained, e.g. sdpa, eager, flash_attention_2")
    p.add_argument("--backend", choices=("native", "lm-eval"), default="native",
                   help="native (offline, default) or lm-eval (lm-evaluation-harness: any "
                        "registered or local task; needs the lm-eval extra; tasks that read "
                        "hub datasets need internet or a local copy)")
    p.add_argument("--lm-eval-include", action="append", default=[], metavar="PATH",
                   help="--backend lm-eval: a directory of local lm-eval task YAMLs (or one "
                        "YAML), passed to lm-eval's TaskManager(include_path=...); repeatable")
    p.add_argument("--qa-dir", default=None,
                   help="RULER's squad.json and hotpotqa.json folder for --tasks qa_1,qa_2 "
                        "(ruler13 = the 11 synthetic tasks + qa_1, qa_2)")
    p.add_argument("--longbench-dir", default=None,
                   help="LongBench's data/ folder ({task}.jsonl): runs its English tasks at "
                        "the largest --lengths (use --tasks none for LongBench alone)")
    p.add_argument("--longbench-lengths", default=None,
                   help="contexts to run LongBench at, e.g. 4k,8k,32k (default: the largest "
                        "--lengths); the largest is the one beside the paper's number")
    p.add_argument("--longbench-e", action="store_true",
                   help="LongBench-E instead (pred.py --e: {task}_e.jsonl files, scores per "
                        "length bucket 0-4k / 4-8k / 8k+ as eval.py's scorer_e)")
    p.add_argument("--short-text-dir", default=None,
                   help="folder of mmlu_test/gsm8k_test/hellaswag_validation/humaneval .jsonl "
                        "(+ mmlu_dev, gsm8k_train for few-shot): short-text retention")
    p.add_argument("--bench-limit", type=int, default=0,
                   help="at most N items per LongBench task / short-text benchmark (0 = all)")
    p.add_argument("--chat-template", choices=("none", "model"), default="none",
                   help="none (prompts as base models get them; a warning when the tokenizer "
                        "ships a chat template) or model (wrap LongBench prompts by LongBench's "
                        "chat rule, short-text and --backend lm-eval prompts with lm-eval's "
                        "apply_chat_template, in the tokenizer's template; RULER and passkey "
                        "stay base)")
    p.add_argument("--save-prompts", default=None,
                   help="JSONL: one line per prompt (task, length, prompt, answer, output, "
                        "score); with lm-eval (--backend lm-eval, short-text MMLU/GSM8K/"
                        "HellaSwag) lm-eval's per-sample log: prompt, target, output, metrics")
    p.add_argument("--output", required=True, help="FILE.json; FILE.md and FILE_*.png go "
                                                   "beside it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_lengths(text: str) -> list[int]:
    """``"4k,8192"`` -> ``[4096, 8192]``."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"(\d+)([kK]?)", item)
        if not m or int(m.group(1)) == 0:
            raise UserError(f"--lengths: {item!r} is not a positive token count (e.g. 4096 "
                            "or 4k)")
        out.append(int(m.group(1)) * (1024 if m.group(2) else 1))
    if not out:
        raise UserError("--lengths: give at least one length, e.g. --lengths 4096,8192")
    return list(dict.fromkeys(out))


def parse_depths(args: argparse.Namespace) -> list[float]:
    """``--depths`` / ``--num-depths`` -> depths in [0, 1]."""
    if args.num_depths is not None:
        if not 1 <= args.num_depths <= MAX_DEPTHS:
            raise UserError(f"--num-depths {args.num_depths}: give 1 to {MAX_DEPTHS} depths")
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


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise UserError(f"--device {name}: use cpu, cuda or cuda:N")
    return name


#: Flags only the native backend reads (refused with --backend lm-eval, not ignored).
NATIVE_ONLY = ("depths", "num_depths", "ppl_data", "attn_implementation")


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The ``EvalConfig`` of parsed flags."""
    if args.backend == "lm-eval":
        for dest in NATIVE_ONLY:
            if getattr(args, dest) is not None:
                raise UserError(f"--{dest.replace('_', '-')} is read by the native backend "
                                "only; drop it with --backend lm-eval")
    elif args.lm_eval_include:
        raise UserError("--lm-eval-include needs --backend lm-eval")
    device = _device(args.device)
    tasks = (resolve_tasks(args.tasks) if args.backend == "native"
             else [t.strip() for t in args.tasks.split(",") if t.strip()])
    return EvalConfig(
        hf_dir=args.hf_dir, output=args.output, lengths=parse_lengths(args.lengths),
        tasks=tasks, depths=parse_depths(args),
        samples=args.samples if args.samples is not None or args.backend != "native" else 5,
        seed=42 if args.seed is None else args.seed, lm_eval_seed=args.seed, device=device,
        dtype=args.dtype or ("bfloat16" if device.startswith("cuda") else "float32"),
        batch_size=args.batch_size, haystack=args.haystack, ppl_data=args.ppl_data,
        ppl_key=args.ppl_key, ppl_stride=args.ppl_stride, ppl_doc_tokens=args.ppl_doc_tokens,
        ppl_max_windows=args.ppl_max_windows, ppl_protocol=args.ppl_protocol,
        attn_implementation=args.attn_implementation, save_prompts=args.save_prompts,
        progress=not args.no_progress, backend=args.backend,
        lm_eval_include=list(args.lm_eval_include), qa_dir=args.qa_dir,
        longbench_dir=args.longbench_dir, short_text_dir=args.short_text_dir,
        bench_limit=args.bench_limit, chat_template=args.chat_template,
        longbench_lengths=(parse_lengths(args.longbench_lengths) if args.longbench_lengths
                           else []),
        longbench_e=args.longbench_e)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)
    results = evaluate(cfg)
    print(markdown_table(results))
    print("wrote " + ", ".join(results.get("written", [])))
    return 0


cli = entry(main)


__all__ = ["build_parser", "main", "cli", "parse_lengths", "parse_depths", "config_from_args"]

if __name__ == "__main__":
    cli()
