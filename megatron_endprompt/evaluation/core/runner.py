"""Running an HF causal LM: loading from disk and batched greedy generation of the prompt
tasks (RULER, passkey). Perplexity lives in ``perplexity``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from megatron_endprompt.errors import UserError
from megatron_endprompt.evaluation.core.prompt import PromptSample
from megatron_endprompt.evaluation.core.scoring import Scorer, score

__all__ = ["load_model", "load_tokenizer", "greedy_generate", "run_generation", "pad_id",
           "model_eos_ids", "model_meta"]


def load_tokenizer(hf_dir: str) -> Any:
    """``AutoTokenizer`` of ``hf_dir`` (local files only)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"--hf-dir {hf_dir}: cannot load a tokenizer ({_first_line(exc)}); "
                        "give an HF directory with tokenizer files") from None


def model_meta(hf_dir: str) -> dict[str, Any]:
    """The model facts every report carries (type, RoPE, ``max_position_embeddings``)."""
    from transformers import AutoConfig  # only here: transformers is slow to import

    try:
        cfg = AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(f"--hf-dir {hf_dir}: cannot read config.json ({exc})") from None
    rope = getattr(cfg, "rope_parameters", None) or {
        "rope_theta": getattr(cfg, "rope_theta", None),
        "rope_scaling": getattr(cfg, "rope_scaling", None)}
    try:
        json.dumps(rope)
    except TypeError:
        rope = str(rope)
    return {"model_type": getattr(cfg, "model_type", None), "rope": rope,
            "max_position_embeddings": getattr(cfg, "max_position_embeddings", None)}


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
                    pad_id: int, eos_ids: Sequence[int] = (), min_new_tokens: int = 0,
                    stop_strings: Sequence[str] = (),
                    tokenizer: Any = None) -> list[list[int]]:
    """Greedy continuations of a batch of prompts (token ids), left-padded with an attention
    mask. Each continuation is cut at its first EOS (excluded); ``min_new_tokens`` suppresses
    EOS before that many tokens (LongBench's samsum). ``stop_strings`` (with ``tokenizer``) end
    a continuation during generation once its text contains one (lm-eval's ``until``: the
    tokens up to the one completing the string are kept; the caller cuts the text)."""
    import torch
    from transformers import GenerationConfig

    width = max(len(p) for p in prompts)
    device = next(model.parameters()).device
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(np.asarray(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    eos = list(eos_ids)
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
                              do_sample=False, num_beams=1, pad_token_id=pad_id,
                              eos_token_id=eos or None,
                              stop_strings=list(stop_strings) or None)
    extra = {"tokenizer": tokenizer} if stop_strings else {}
    with torch.inference_mode():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             generation_config=config, **extra)
    result = []
    for row in out[:, width:].tolist():
        cut = next((k for k, t in enumerate(row) if t in eos or t == pad_id and stop_strings),
                   len(row))
        result.append(row[:cut])
    return result


def model_eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every EOS id of the model's generation config, config and tokenizer."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        ids.update([e] if isinstance(e, int) else list(e or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def pad_id(tokenizer: Any) -> int:
    """The pad id for left padding (pad, else EOS, else 0)."""
    for t in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if t is not None:
            return int(t)
    return 0


def run_generation(model: Any, tokenizer: Any, samples: Sequence[PromptSample], *,
                   batch_size: int, progress: Any = None,
                   scorers: Mapping[str, Scorer] | None = None) -> list[dict[str, Any]]:
    """Greedily continue and score every sample; one record per sample, in input order:
    ``task, length, index, depth, prompt, answer, output, score`` (+ the sample's ``extra``).

    Batches hold prompts of one task and length (RULER's prompts of one length differ by a
    few tokens: left padding with an attention mask). The output is decoded without special
    tokens and scored by ``scorers[sample.task]`` (the task table's scorer of the task), else
    by the sample's ``metric`` (a key of ``scoring.METRICS``). ``progress`` (tqdm or ``None``)
    advances by one per sample.
    """
    pad, eos = pad_id(tokenizer), model_eos_ids(model, tokenizer)
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
                prompt = s.prompt if s.prompt is not None else tokenizer.decode(
                    [int(t) for t in s.input_ids], skip_special_tokens=True)
                records[i] = {
                    "task": s.task, "length": s.length, "index": s.index, "depth": s.depth,
                    "prompt": prompt, "prompt_tokens": len(s.input_ids),
                    "answer": list(s.answers), "output": pred,
                    "score": (float(scorers[s.task](pred, s.answers))
                              if scorers and s.task in scorers
                              else score(s.metric, pred, s.answers)), **s.extra,
                }
            if progress is not None:
                progress.update(len(batch))
    return [r for r in records if r is not None]
