"""Running an HF causal LM: loading from disk, batched greedy generation for the retrieval
tasks, and sliding-window perplexity.

Perplexity follows PoSE/LongLoRA: windows of ``length`` tokens start every ``stride`` tokens of
the evaluation token stream; every token of every window is scored (next-token NLL), and the
result is ``exp(mean token NLL)``. Logits are computed in chunks of positions from the final
hidden states, so a 128K-token window of a 128K-vocabulary model never materialises a full
``length x vocab`` float32 tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.scoring import PerplexityStats, score
from megatron_endprompt.evaluation.tasks import Sample

__all__ = ["load_model", "load_tokenizer", "greedy_generate", "run_retrieval",
           "load_ppl_tokens", "window_starts", "window_nll", "run_perplexity"]

DTYPES = ("float32", "bfloat16", "float16")


def load_tokenizer(hf_dir: str) -> Any:
    """``AutoTokenizer`` of ``hf_dir`` (local files only)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"--hf-dir {hf_dir}: cannot load a tokenizer ({_first_line(exc)}); "
                        "give an HF directory with tokenizer files") from None


def load_model(hf_dir: str, *, device: str, dtype: str,
               attn_implementation: str | None = None) -> Any:
    """``AutoModelForCausalLM`` of ``hf_dir`` (local files only) in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": getattr(torch, dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(hf_dir, **kwargs)
    except (OSError, ValueError) as exc:
        raise UserError(f"--hf-dir {hf_dir}: cannot load a causal LM ({_first_line(exc)}); "
                        "give an HF model directory (config.json + weights)") from None
    return model.to(device).eval()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def greedy_generate(model: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                    pad_id: int, eos_ids: Sequence[int] = ()) -> list[list[int]]:
    """Greedy continuations of a batch of prompts (token ids), left-padded with an attention
    mask. Each continuation is cut at its first EOS (excluded)."""
    import torch
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    device = next(model.parameters()).device
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    eos = list(eos_ids)
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False,
                              num_beams=1, pad_token_id=pad_id,
                              eos_token_id=eos or None)
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             generation_config=config)
    result = []
    for row in out[:, width:].tolist():
        cut = next((k for k, t in enumerate(row) if t in eos), len(row))
        result.append(row[:cut])
    return result


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        ids.update([e] if isinstance(e, int) else list(e or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def _pad_id(tokenizer: Any) -> int:
    for t in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if t is not None:
            return int(t)
    return 0


def run_retrieval(model: Any, tokenizer: Any, samples: Sequence[Sample], *, batch_size: int,
                  progress: Any = None) -> list[dict[str, Any]]:
    """Generate and score every sample; returns one record per sample, in input order.

    Batches hold prompts of one task and length (so equal lengths: no padding in practice).
    ``progress`` (a tqdm bar or ``None``) is advanced by one per sample.
    """
    pad, eos = _pad_id(tokenizer), _eos_ids(model, tokenizer)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.task, s.length), []).append(i)
    records: list[dict[str, Any] | None] = [None] * len(samples)
    for idxs in groups.values():
        for b in range(0, len(idxs), batch_size):
            batch = [samples[i] for i in idxs[b:b + batch_size]]
            outs = greedy_generate(model, [s.input_ids for s in batch],
                                   max_new_tokens=max(s.max_new_tokens for s in batch),
                                   pad_id=pad, eos_ids=eos)
            for i, s, out in zip(idxs[b:b + batch_size], batch, outs, strict=True):
                pred = tokenizer.decode(out[:s.max_new_tokens], skip_special_tokens=True)
                records[i] = {
                    "task": s.task, "length": s.length, "depth": s.depth, "index": s.index,
                    "needle_depths": [round(d, 6) for d in s.needle_depths],
                    "answers": list(s.answers), "prediction": pred,
                    "score": score(s.metric, pred, s.answers),
                }
            if progress is not None:
                progress.update(len(batch))
    return [r for r in records if r is not None]


def load_ppl_tokens(path: str, tokenizer: Any, *, key: str = "text") -> np.ndarray:
    """The evaluation token stream of a ``.txt`` file (one document) or a ``.jsonl`` file
    (documents in field ``key``, joined with EOS when the tokenizer has one)."""
    if not os.path.isfile(path):
        raise UserError(f"--ppl-data {path}: no such file; give a .txt or .jsonl file")
    docs: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".jsonl"):
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)[key]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise UserError(f"--ppl-data {path}:{n}: not a JSON object with a "
                                        f"string field {key!r} (set --ppl-key)") from None
                    if not isinstance(doc, str):
                        raise UserError(f"--ppl-data {path}:{n}: field {key!r} is not a string")
                    if not doc.isascii():  # lone surrogates from \ud800-style escapes
                        try:
                            doc.encode("utf-8")
                        except UnicodeEncodeError as exc:
                            raise UserError(
                                f"--ppl-data {path}:{n}: lone surrogate "
                                f"{doc[exc.start].encode('unicode_escape').decode()} in field "
                                f"{key!r} (half of a UTF-16 pair); fix or drop the line") from None
                    docs.append(doc)
            elif path.endswith(".txt"):
                docs.append(f.read())
            else:
                raise UserError(f"--ppl-data {path}: unknown format; give a .txt or .jsonl "
                                "file")
    except UnicodeDecodeError as exc:
        raise UserError(f"--ppl-data {path}: not UTF-8 text ({exc.reason})") from None
    eos = tokenizer.eos_token_id
    parts: list[np.ndarray] = []
    for b in range(0, len(docs), 256):
        enc = tokenizer(docs[b:b + 256], add_special_tokens=False, verbose=False)["input_ids"]
        for ids in enc:
            if parts and eos is not None:
                parts.append(np.array([eos], dtype=np.int64))
            parts.append(np.asarray(ids, dtype=np.int64))
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if len(tokens) < 2:
        raise UserError(f"--ppl-data {path}: no text to score")
    return tokens


def window_starts(n_tokens: int, length: int, stride: int,
                  max_windows: int | None = None) -> list[int]:
    """Starts of the windows of ``length`` inputs (+1 target) every ``stride`` tokens; at most
    ``max_windows``, evenly spread over the stream when capped."""
    starts = list(range(0, n_tokens - length, stride))
    if max_windows and len(starts) > max_windows:
        pick = np.linspace(0, len(starts) - 1, max_windows).round().astype(int)
        starts = [starts[i] for i in pick]
    return starts


def _needs_full_logits(model: Any) -> bool:
    cfg = model.config
    return bool(getattr(cfg, "final_logit_softcapping", None)
                or getattr(cfg, "logit_scale", None)
                or model.get_output_embeddings() is None)


def window_nll(model: Any, inputs: Any, targets: Any, *, chunk: int = 1024) -> Any:
    """Summed next-token NLL (float64, shape ``(batch,)``) of ``targets`` given ``inputs``
    (both ``(batch, length)`` on the model's device)."""
    import torch
    import torch.nn.functional as F

    def nll(logits: Any, tgt: Any) -> Any:
        return F.cross_entropy(logits.float().transpose(1, 2), tgt,
                               reduction="none").double().sum(-1)

    with torch.inference_mode():
        if _needs_full_logits(model):
            return nll(model(input_ids=inputs, use_cache=False).logits, targets)
        hidden = model.get_decoder()(input_ids=inputs, use_cache=False).last_hidden_state
        head = model.get_output_embeddings()
        total = torch.zeros(inputs.shape[0], dtype=torch.float64, device=inputs.device)
        for s in range(0, inputs.shape[1], chunk):
            total += nll(head(hidden[:, s:s + chunk]), targets[:, s:s + chunk])
        return total


def run_perplexity(model: Any, tokens: np.ndarray, *, length: int, stride: int,
                   batch_size: int, max_windows: int | None = None,
                   progress: Any = None) -> PerplexityStats:
    """Sliding-window perplexity at ``length`` (see the module docstring)."""
    import torch

    device = next(model.parameters()).device
    starts = window_starts(len(tokens), length, stride, max_windows)
    stats = PerplexityStats()
    for b in range(0, len(starts), batch_size):
        rows = np.stack([tokens[s:s + length + 1] for s in starts[b:b + batch_size]])
        batch = torch.from_numpy(rows).to(device)
        sums = window_nll(model, batch[:, :-1], batch[:, 1:])
        stats.add(nll_sum=float(sums.sum()), tokens=int(rows.shape[0] * length),
                  windows=int(rows.shape[0]))
        if progress is not None:
            progress.update(rows.shape[0])
    return stats
