"""The choices of one evaluation run (``EvalConfig``): the CLI parses flags into it, the native
pipeline (``suite.run_eval``) and the lm-eval backend run it. ``validate`` refuses every
inconsistent choice that needs no task family's knowledge, before anything is loaded."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.results_io import (check_outputs_apart,
                                                         check_weights_readable, output_paths)

__all__ = ["EvalConfig", "MAX_LENGTH", "MAX_SAMPLES", "MAX_DEPTHS", "MAX_BATCH_SIZE", "MAX_SEED"]

#: Longest length any run may ask for (tokens): 32x the paper's 64K. A typo such as ``4096k``
#: is refused at once instead of building prompts for hours; the model's own bound
#: (``suite.MAX_LENGTH_FACTOR`` x ``max_position_embeddings``) is checked once its config is read.
MAX_LENGTH = 1 << 21
#: Most prompts per task x length: 20x RULER's ``NUM_SAMPLES`` (500).
MAX_SAMPLES = 10_000
#: Most needle depths (``--depths`` / ``--num-depths``): one per percent, 0% to 100%.
MAX_DEPTHS = 101
#: Largest generation batch.
MAX_BATCH_SIZE = 1024
#: Largest seed: numpy's (and lm-eval's) seeds are unsigned 32-bit.
MAX_SEED = 2**32 - 1


@dataclass(kw_only=True)
class EvalConfig:
    """One evaluation run of an HF model directory."""

    hf_dir: str
    """HF model directory (config, weights, tokenizer), read from disk only."""
    output: str
    """``FILE.json``; ``FILE.md`` and ``FILE_*.png`` go beside it."""
    lengths: list[int]
    """Evaluation lengths in tokens (prompt + generated tokens never exceed one)."""
    tasks: list[str]
    """Task names (groups already expanded): names of the task table (``task_table.TASKS``:
    RULER, ``passkey``, ``legacy_*``) and ``ppl``; lm-eval's names with ``backend="lm-eval"``."""
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    """Passkey (and legacy) needle depths; RULER tasks place needles as RULER does."""
    samples: int | None = 5
    """Prompts per task x length (x depth for passkey); for ``backend="lm-eval"`` documents
    per task (per task x length for RULER), ``None`` = all of lm-eval's documents."""
    seed: int = 42
    """RULER's default ``--random_seed`` (prompts of the native tasks, torch)."""
    lm_eval_seed: int | None = None
    """``--seed`` as given, for lm-eval (short text, ``--backend lm-eval``); ``None``: lm-eval's
    own default seeds (``lm_eval.seeds``)."""
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 1
    haystack: str | None = None
    """Essay haystack file; ``None`` = the shipped public-domain substitute."""
    ppl_data: str | None = None
    """PG19-style ``.jsonl`` (or one ``.txt`` document) for ``ppl``."""
    ppl_key: str = "text"
    ppl_stride: int = 256
    ppl_doc_tokens: int = 0
    """Score only the first N tokens of each document (0 = all)."""
    ppl_max_windows: int = 0
    """At most N windows per length, evenly spread (0 = all)."""
    ppl_protocol: str = "document"
    """``document`` (PoSE/LongLoRA) or ``legacy-stream`` (EOS-joined stream, old results)."""
    attn_implementation: str | None = None
    save_prompts: str | None = None
    """JSONL: one line per prompt (task, length, prompt, answer, output, score)."""
    progress: bool = True
    backend: str = "native"
    """``native`` (our offline tasks) or ``lm-eval`` (lm-evaluation-harness's tasks)."""
    lm_eval_include: list[str] = field(default_factory=list)
    """Directories or YAML files of local lm-eval tasks (``TaskManager(include_path=...)``)."""
    qa_dir: str | None = None
    """RULER's ``squad.json`` / ``hotpotqa.json`` folder for ``qa_1`` / ``qa_2``."""
    longbench_dir: str | None = None
    """LongBench's ``data/`` folder (``{task}.jsonl``): runs LongBench at the largest length."""
    short_text_dir: str | None = None
    """MMLU / GSM8K / HellaSwag / HumanEval JSONL folder (``short_text``): runs them."""
    bench_limit: int = 0
    """At most N items per LongBench task / short-text benchmark (0 = all)."""
    longbench_lengths: list[int] = field(default_factory=list)
    """LongBench contexts (empty: the largest length); the paper table shows the largest."""
    longbench_e: bool = False
    """LongBench-E (``{task}_e.jsonl``, scores per length bucket) instead of LongBench."""
    chat_template: str = "none"
    """``none`` (prompts as base models get them) or ``model`` (the tokenizer's chat template
    for LongBench, short-text and ``--backend lm-eval``; RULER and passkey stay base)."""

    def validate(self) -> None:
        """Raise ``UserError`` naming the flag for every inconsistent choice (before anything
        is created or loaded). What a task needs of the flags (``--qa-dir``, a haystack some
        task reads) is the task table's to check (``suite.check_config``)."""
        if self.samples is None and self.backend == "native":
            raise UserError("--samples: give a count (prompts per task x length)")
        for name, value, low in (("--samples", 1 if self.samples is None else self.samples, 1),
                                 ("--batch-size", self.batch_size, 1),
                                 ("--ppl-stride", self.ppl_stride, 1),
                                 ("--ppl-doc-tokens", self.ppl_doc_tokens, 0),
                                 ("--ppl-max-windows", self.ppl_max_windows, 0),
                                 ("--bench-limit", self.bench_limit, 0)):
            if value < low:
                raise UserError(f"{name} must be >= {low} (got {value})")
        if self.chat_template not in ("none", "model"):
            raise UserError(f"--chat-template {self.chat_template}: use none or model")
        if self.ppl_protocol not in ("document", "legacy-stream"):
            raise UserError(f"--ppl-protocol {self.ppl_protocol}: use document or "
                            "legacy-stream")
        if not self.lengths:
            raise UserError("--lengths: give at least one length")
        self._check_sizes()
        if not os.path.isdir(self.hf_dir):
            raise UserError(f"--hf-dir {self.hf_dir}: no such directory")
        if not os.path.isfile(os.path.join(self.hf_dir, "config.json")):
            raise UserError(f"--hf-dir {self.hf_dir}: no config.json; give an HF model "
                            "directory (e.g. the converter's output)")
        for flag, path in (("--qa-dir", self.qa_dir), ("--longbench-dir", self.longbench_dir),
                           ("--short-text-dir", self.short_text_dir)):
            if path is not None and not os.path.isdir(path):
                raise UserError(f"{flag} {path}: no such directory")
        self._check_outputs()  # before the first file is opened
        check_weights_readable(self.hf_dir)
        if (self.longbench_lengths or self.longbench_e) and not self.longbench_dir:
            raise UserError("--longbench-lengths / --longbench-e need --longbench-dir DIR")
        if not self.tasks and not (self.longbench_dir or self.short_text_dir):
            raise UserError("--tasks none: give --longbench-dir or --short-text-dir, or tasks")
        if "ppl" in self.tasks and not self.ppl_data:
            raise UserError("--tasks ppl needs --ppl-data FILE (PG19-style .jsonl or .txt)")
        if self.haystack is not None and self.backend != "native":
            raise UserError("--haystack is read by the native backend only (lm-eval's essay "
                            "tasks read its own copy); drop --haystack")
        if self.device.startswith("cuda"):
            import torch  # only here: torch costs seconds at start-up and is not needed before

            if not torch.cuda.is_available():
                raise UserError(f"--device {self.device}: CUDA is not available here; use "
                                "--device cpu")

    def _check_sizes(self) -> None:
        """Every size flag within its bound (before any work: ``--num-depths 10**9`` or
        ``--samples 10**9`` would build prompts for hours)."""
        for flag, values, high in (("--lengths", self.lengths, MAX_LENGTH),
                                   ("--longbench-lengths", self.longbench_lengths, MAX_LENGTH),
                                   ("--samples", [self.samples or 1], MAX_SAMPLES),
                                   ("--batch-size", [self.batch_size], MAX_BATCH_SIZE)):
            over = [v for v in values if v > high]
            if over:
                hint = (" (omit --samples for all of lm-eval's documents)"
                        if flag == "--samples" and self.backend != "native" else "")
                raise UserError(f"{flag} {over[0]}: at most {high:,}{hint}; give a smaller "
                                "value")
            if any(v < 1 for v in values):
                raise UserError(f"{flag}: every value must be >= 1")
        if not 1 <= len(self.depths) <= MAX_DEPTHS:
            raise UserError(f"--depths / --num-depths: give 1 to {MAX_DEPTHS} depths (got "
                            f"{len(self.depths)})")
        if any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise UserError("--depths: every depth must be in [0, 1]")
        for seed in (self.seed, self.lm_eval_seed):
            if seed is not None and not 0 <= seed <= MAX_SEED:
                raise UserError(f"--seed {seed}: give an integer in [0, {MAX_SEED}]")

    def _check_outputs(self) -> None:
        """``--output`` names a JSON file, and every file the run writes (``FILE.json``,
        ``FILE.md``, ``FILE_niah.png``, ``FILE_ppl.png``, ``--save-prompts``) is apart from
        every input and from the others (before anything is opened)."""
        if self.output.endswith((".md", ".png")):
            raise UserError(f"--output {self.output}: give the JSON path (FILE.json)")
        if os.path.isdir(self.output):
            raise UserError(f"--output {self.output} is a directory; give the JSON path, e.g. "
                            f"{os.path.join(self.output, 'results.json')}")
        for flag, path, example in (("--output", self.output, "results.json"),
                                    ("--save-prompts", self.save_prompts, "prompts.jsonl")):
            if path is None:
                continue
            stem = os.path.basename(path[:-5] if path.endswith(".json") else path)
            if not stem:
                raise UserError(f"{flag} {path!r} names no file (its reports would be hidden "
                                f"files such as .json); give a file path, e.g. "
                                f"{os.path.join(path, example)}")
        paths = output_paths(self.output)
        outputs = [("--output", paths[k]) for k in ("json", "md", "niah_png", "ppl_png")]
        if self.save_prompts is not None:
            outputs.append(("--save-prompts", self.save_prompts))
        inputs = [(flag, path) for flag, path in (
            ("--hf-dir", self.hf_dir), ("--ppl-data", self.ppl_data),
            ("--haystack", self.haystack), ("--longbench-dir", self.longbench_dir),
            ("--short-text-dir", self.short_text_dir), ("--qa-dir", self.qa_dir),
            *(("--lm-eval-include", p) for p in self.lm_eval_include)) if path]
        check_outputs_apart(outputs, inputs)
