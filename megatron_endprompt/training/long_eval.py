"""Long-context validation inside Megatron's training loop: ``long-eval/ppl@L`` and
``long-eval/passkey@L`` while a 64K run trains on short sequences.

    --endprompt-long-eval-interval 500 --endprompt-long-eval-lengths 16384,32768,65536 \\
    --endprompt-long-eval-tasks ppl,passkey --endprompt-long-eval-data held_out.jsonl

Hooked through ``pretrain``'s ``non_loss_data_func`` extension point, which Megatron calls on
every rank at the end of each validation (``--eval-interval``, model in eval mode); we run on
the validations whose iteration is a multiple of the long-eval interval (which must be a
multiple of ``--eval-interval``). Each prompt is one forward-only micro-batch of
``[1, L]`` tokens with contiguous positions ``0..L-1`` through Megatron's own
``forward_backward_func``, so TP (vocab-parallel logits), PP (p2p of ``[L, 1, h]``
activations, virtual stages) and CP (``get_batch_on_this_cp_rank`` slicing, sums all-reduced
over the CP group) all work as in training.

* ``ppl``: documents of ``--endprompt-long-eval-data`` (PG19-style ``.jsonl``, a ``.txt``
  document, or a Megatron ``.bin/.idx`` prefix) with at least ``L`` tokens, BOS first and cut
  to ``L`` tokens; PPL = ``exp(total NLL / scored tokens)`` over the first
  ``--endprompt-long-eval-samples`` such documents. This equals the offline tool's
  per-document PPL with ``--ppl-doc-tokens L`` on the exported model: padded vocabulary
  entries are masked out of the softmax, as the export removes them.
* ``passkey``: the landmark-attention prompt of ``evaluation.passkey`` at evenly spaced depths,
  the answer teacher-forced: a prompt counts when the argmax at every answer position is the
  answer token (what greedy decoding would produce).

Results go to the console (last rank), TensorBoard and W&B (Megatron's writers).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from megatron_endprompt.errors import UserError

if TYPE_CHECKING:
    from megatron_endprompt.training.run import LongEvalSettings

__all__ = ["add_long_eval_args", "long_eval_hook", "LongEvaluator", "mask_padding",
           "pick_global_argmax"]


def add_long_eval_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the ``--endprompt-long-eval-*`` flags."""
    g = parser.add_argument_group("EndPrompt long-context validation")
    g.add_argument("--endprompt-long-eval-interval", type=int, default=0,
                   help="evaluate at long lengths every N iterations (a multiple of "
                        "--eval-interval; 0 = off)")
    g.add_argument("--endprompt-long-eval-lengths", default=None,
                   help="comma list of lengths, e.g. 16384,32768,65536 (default: the target "
                        "length)")
    g.add_argument("--endprompt-long-eval-tasks", default="ppl,passkey",
                   help="comma list of ppl, passkey")
    g.add_argument("--endprompt-long-eval-data", default=None,
                   help="held-out long documents for ppl: .jsonl (field 'text'), .txt, or a "
                        "Megatron .bin/.idx prefix")
    g.add_argument("--endprompt-long-eval-samples", type=int, default=4,
                   help="documents (ppl) and prompts (passkey) per length")
    return parser


def long_eval_hook(settings: LongEvalSettings | None, args: argparse.Namespace) -> Any:
    """The ``non_loss_data_func`` for ``pretrain`` (``None`` when long-eval is off); ``args``:
    Megatron's flags (``--eval-interval``, ``--eval-iters``, ``--seed``). Bad flags end the run
    with one ``error:`` line."""
    if settings is None or not settings.interval:
        return None
    try:
        return LongEvaluator(settings, args)
    except ValueError as exc:
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


class LongEvaluator:
    """``non_loss_data_func``: see the module docstring."""

    def __init__(self, settings: LongEvalSettings, args: argparse.Namespace):
        self.interval = int(settings.interval)
        if self.interval < 0:
            raise ValueError("--endprompt-long-eval-interval must be >= 0")
        if not args.eval_interval or self.interval % args.eval_interval:
            raise ValueError(f"--endprompt-long-eval-interval {self.interval} must be a "
                             f"multiple of --eval-interval {args.eval_interval} (long-eval runs "
                             "at Megatron's validation); change one of them")
        if not args.eval_iters:
            raise ValueError("--endprompt-long-eval-interval needs validation: set "
                             "--eval-iters > 0 (and validation data)")
        L = settings.target_length
        text = settings.lengths or str(L)
        try:
            self.lengths = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--endprompt-long-eval-lengths {text}: give integers, e.g. "
                             "16384,32768") from None
        too_long = [n for n in self.lengths if n > L or n < 16]
        if not self.lengths or too_long:
            raise ValueError(f"--endprompt-long-eval-lengths {text}: each length must be in "
                             f"[16, --endprompt-target-length {L}]")
        self.tasks = [t.strip() for t in settings.tasks.split(",") if t.strip()]
        unknown = [t for t in self.tasks if t not in ("ppl", "passkey")]
        if unknown or not self.tasks:
            raise ValueError(f"--endprompt-long-eval-tasks: unknown {unknown}; use ppl, passkey")
        self.samples = int(settings.samples)
        if self.samples < 1:
            raise ValueError("--endprompt-long-eval-samples must be >= 1")
        self.data = settings.data
        if "ppl" in self.tasks and not self.data:
            raise ValueError("--endprompt-long-eval-tasks ppl needs --endprompt-long-eval-data "
                             "(held-out long documents: .jsonl, .txt or a .bin/.idx prefix)")
        self._texts = _check_data(self.data) if self.data else None
        self.seed = int(args.seed)
        self._last: int | None = None
        self._docs: list[np.ndarray] | None = None
        self._warned: set[int] = set()

    # -- inputs --------------------------------------------------------------------------
    def _tokenizer(self) -> Any:
        from megatron.training import get_tokenizer

        return get_tokenizer()

    def _bos(self) -> list[int]:
        tok = self._tokenizer()
        for name in ("bos", "bos_id", "bos_token_id"):
            try:
                v = getattr(tok, name)
            except (AttributeError, NotImplementedError):
                continue
            if isinstance(v, int) and v >= 0:
                return [v]
        return []

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` with exactly one BOS first (when the tokenizer has one): Megatron's
        HF tokenizer already adds it, SentencePiece does not."""
        bos = self._bos()
        ids = list(self._tokenizer().tokenize(text))
        return ids if not bos or ids[:1] == bos else bos + ids

    def documents(self) -> list[np.ndarray]:
        """Token ids per held-out document, BOS first (read once)."""
        if self._docs is None:
            bos = self._bos()
            if os.path.isfile(str(self.data) + ".idx"):
                from megatron.core.datasets.indexed_dataset import IndexedDataset

                ds = IndexedDataset(str(self.data))
                docs = [np.asarray(ds[i], dtype=np.int64) for i in range(len(ds))]
                docs = [d if bos and d[:1].tolist() == bos else
                        np.concatenate([np.asarray(bos, dtype=np.int64), d]) for d in docs]
            else:
                docs = [np.asarray(self.encode(t), dtype=np.int64) for t in self._texts]
            self._docs = docs
        return self._docs

    def passkey_prompts(self, length: int) -> list[tuple[list[int], list[int]]]:
        """``(prompt ids, answer ids)`` per depth; prompt + answer fit ``length``."""
        from megatron_endprompt.evaluation.passkey.passkey import passkey_prompt

        bos = self._bos()
        out = []
        depths = [0.5] if self.samples == 1 else list(np.linspace(0, 1, self.samples))
        for i, depth in enumerate(depths):
            key = random.Random(f"{self.seed}:long-eval:{length}:{i}").randint(1, 50000)

            def ids(n: int) -> tuple[list[int], list[int]]:
                text = passkey_prompt(key, n, float(depth))
                prompt, full = self.encode(text), self.encode(text + f" {key}")
                if full[:len(prompt)] != prompt:  # the key merged with the prompt's end
                    answer = self.encode(f" {key}")
                    return prompt, answer[len(bos):] if answer[:len(bos)] == bos else answer
                return prompt, full[len(prompt):]

            lo, hi, best = 0, 8 * length, None
            while lo <= hi:
                mid = (lo + hi) // 2
                p, a = ids(mid)
                if len(p) + len(a) <= length:
                    best, lo = (p, a), mid + 1
                else:
                    hi = mid - 1
            if best is None:
                raise ValueError(f"long-eval passkey: length {length} is too short")
            out.append(best)
        return out

    # -- forward -------------------------------------------------------------------------
    def _forward(self, model: list[Any], tokens: list[int], score_from: int,
                 mode: str) -> tuple[float, float]:
        """One forward of ``tokens`` (contiguous positions). ``nll``: summed NLL of targets
        ``tokens[score_from:]`` and their count; ``argmax``: correct argmax predictions of
        those targets and their count. On the last pipeline stage; ``(0, 0)`` elsewhere."""
        from megatron.core import parallel_state as mpu
        from megatron.core.pipeline_parallel import get_forward_backward_func

        device = torch.device("cuda", torch.cuda.current_device()) if \
            torch.cuda.is_available() else torch.device("cpu")
        # sequence parallelism splits the sequence over TP, CP into 2 * cp chunks: pad at the
        # end (causal attention: padding never reaches the scored positions), mask it out
        from megatron.training import get_args

        tp, cp = (mpu.get_tensor_model_parallel_world_size(),
                  mpu.get_context_parallel_world_size())
        multiple = math.lcm(tp if getattr(get_args(), "sequence_parallel", False) else 1,
                            2 * cp if cp > 1 else 1)
        real = len(tokens)
        n = real + (-real) % multiple
        ids = torch.zeros(1, n, dtype=torch.int64, device=device)
        ids[0, :real] = torch.tensor(tokens, dtype=torch.int64, device=device)
        labels = torch.zeros_like(ids)
        labels[:, :real - 1] = ids[:, 1:real]
        mask = torch.zeros(1, n, dtype=torch.float32, device=device)
        mask[:, score_from - 1:real - 1] = 1.0
        batch = {"tokens": ids, "labels": labels, "loss_mask": mask,
                 "position_ids": torch.arange(n, device=device)[None]}
        if mpu.get_context_parallel_world_size() > 1:
            from megatron.core.utils import get_batch_on_this_cp_rank

            batch["cu_seqlens"] = None
            batch = get_batch_on_this_cp_rank(batch, is_hybrid_cp=False,
                                              cp_group=mpu.get_context_parallel_group())
            batch.pop("cu_seqlens", None)
        store = get_forward_backward_func()(
            forward_step_func=partial(_step, mode=mode, vocab=self._vocab_size()),
            data_iterator=[iter([batch]) for _ in model], model=model, num_microbatches=1,
            seq_length=n, micro_batch_size=1, decoder_seq_length=n, forward_only=True,
            collect_non_loss_data=True)
        if not store:
            return 0.0, 0.0
        total = torch.stack([store[0][0], store[0][1]]).double()
        if mpu.get_context_parallel_world_size() > 1:
            torch.distributed.all_reduce(total, group=mpu.get_context_parallel_group())
        return float(total[0]), float(total[1])

    def _vocab_size(self) -> int:
        return int(self._tokenizer().vocab_size)

    # -- the hook ------------------------------------------------------------------------
    def __call__(self, model: Any) -> None:
        from megatron.training import get_args

        iteration = int(getattr(get_args(), "curr_iteration", 0)) + 1
        if iteration % self.interval or iteration == self._last:
            return None
        self._last = iteration
        model = model if isinstance(model, list) else [model]
        results: dict[str, float | None] = {}
        with torch.no_grad():
            for length in self.lengths:
                if "ppl" in self.tasks:
                    results[f"long-eval/ppl@{length}"] = self._ppl(model, length)
                if "passkey" in self.tasks:
                    results[f"long-eval/passkey@{length}"] = self._passkey(model, length)
        _log(results, iteration)
        return None

    def _ppl(self, model: list[Any], length: int) -> float | None:
        docs = [d[:length] for d in self.documents() if len(d) >= length][:self.samples]
        if not docs and length not in self._warned:  # said once, not a silent ``None``
            self._warned.add(length)
            longest = max((len(d) for d in self.documents()), default=0)
            if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
                print(f"warning: --endprompt-long-eval-data {self.data}: no document has "
                      f"{length} tokens (longest {longest}); ppl@{length} is not measured: add "
                      "longer documents or lower --endprompt-long-eval-lengths", flush=True)
        nll = count = 0.0
        for d in docs:
            s, c = self._forward(model, d.tolist(), 1, "nll")
            nll, count = nll + s, count + c
        if not count:
            return None
        try:
            return math.exp(nll / count)
        except OverflowError:
            return math.inf

    def _passkey(self, model: list[Any], length: int) -> float | None:
        prompts = self.passkey_prompts(length)
        hits = 0
        last = False
        for prompt, answer in prompts:
            ok, count = self._forward(model, prompt + answer, len(prompt), "argmax")
            last = last or count > 0
            hits += int(count > 0 and ok == count)
        return hits / len(prompts) if last else None


def _check_data(data: str) -> list[str] | None:
    """Validate ``--endprompt-long-eval-data`` at start-up, not at the first evaluation deep
    in training: a ``.bin/.idx`` prefix must have both files and a readable index; a
    ``.jsonl``/``.txt`` file must parse and hold a document. Returns the texts (read once) or
    ``None`` for a prefix. Raises ``ValueError`` (one ``error:`` line in the hook)."""
    flag = "--endprompt-long-eval-data"
    if os.path.isfile(data + ".idx"):
        if not os.path.isfile(data + ".bin"):
            raise ValueError(f"{flag} {data}: {data}.bin not found; give a prefix with both "
                             ".bin and .idx (written by preprocessing)")
        with open(data + ".idx", "rb") as f:
            if f.read(9) != b"MMIDIDX\x00\x00":
                raise ValueError(f"{flag} {data}.idx: not a Megatron index; rebuild the prefix")
        return None
    if not os.path.isfile(data):
        raise ValueError(f"{flag} {data}: no such file or prefix")
    from megatron_endprompt.evaluation.perplexity.windows import load_documents

    try:
        texts = load_documents(data, flag=flag)
    except UserError as exc:
        raise ValueError(str(exc)) from None
    except UnicodeDecodeError:
        raise ValueError(f"{flag} {data}: not UTF-8 text; convert it to UTF-8") from None
    if not any(t.strip() for t in texts):
        raise ValueError(f"{flag} {data}: holds no document; give held-out long documents")
    return texts


def _step(data_iterator: Any, model: Any, *, mode: str, vocab: int) -> tuple[Any, Any]:
    """Forward step of one long-eval micro-batch; the loss function reduces it."""
    from megatron.core.utils import get_attr_wrapped_model

    batch = next(data_iterator)
    first = bool(get_attr_wrapped_model(model, "pre_process"))
    output = model(batch["tokens"] if first else None, batch["position_ids"], None)
    return output, partial(_reduce, batch, mode, vocab)


def _reduce(batch: dict[str, Any], mode: str, vocab: int, logits: Any,
            non_loss_data: bool = False) -> tuple[Any, Any]:
    """``(sum, count)`` of NLL (``nll``) or of correct argmax predictions (``argmax``) over the
    masked positions, from vocab-parallel logits ``[B, S, V/tp]`` (padding masked out)."""
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    start = mpu.get_tensor_model_parallel_rank() * logits.shape[-1]
    logits = mask_padding(logits.float(), start, vocab)
    mask, labels = batch["loss_mask"], batch["labels"]
    if mode == "nll":
        loss = vocab_parallel_cross_entropy(logits.transpose(0, 1).contiguous(),
                                            labels.transpose(0, 1).contiguous())
        return (loss.transpose(0, 1) * mask).sum(), mask.sum()
    best, idx = logits.max(dim=-1)
    idx = idx + start
    tp = mpu.get_tensor_model_parallel_world_size()
    if tp > 1:
        group = mpu.get_tensor_model_parallel_group()
        bests = [torch.empty_like(best) for _ in range(tp)]
        idxs = [torch.empty_like(idx) for _ in range(tp)]
        torch.distributed.all_gather(bests, best.contiguous(), group=group)
        torch.distributed.all_gather(idxs, idx.contiguous(), group=group)
        idx = pick_global_argmax(torch.stack(bests), torch.stack(idxs))
    correct = (idx == labels).float() * mask
    return correct.sum(), mask.sum()


def mask_padding(logits: torch.Tensor, start: int, vocab: int) -> torch.Tensor:
    """``logits [..., V/tp]`` of the vocabulary shard starting at id ``start``, with the ids
    ``>= vocab`` (Megatron's vocabulary padding, which the export removes) set to ``-inf``."""
    ids = torch.arange(start, start + logits.shape[-1], device=logits.device)
    return logits.masked_fill(ids >= vocab, float("-inf"))


def pick_global_argmax(bests: torch.Tensor, idxs: torch.Tensor) -> torch.Tensor:
    """The argmax over the whole vocabulary from each TP rank's maximum ``bests [tp, ...]``
    and its global id ``idxs [tp, ...]``: the largest value, the lowest rank on ties (so the
    lowest id, as ``torch.argmax`` over the full logits)."""
    return idxs.gather(0, bests.argmax(dim=0)[None])[0]


def _log(results: dict[str, float | None], iteration: int) -> None:
    """Console (last rank), TensorBoard and W&B."""
    from megatron.training.global_vars import get_tensorboard_writer, get_wandb_writer
    from megatron.training.utils import print_rank_last

    parts = [f"{k.split('/', 1)[1]} {v!r}" for k, v in results.items()]
    print_rank_last(f" long-eval at iteration {iteration} | " + " | ".join(parts))
    writer = get_tensorboard_writer()
    finite = {k: v for k, v in results.items() if v is not None and math.isfinite(v)}
    if writer:
        for k, v in finite.items():
            writer.add_scalar(k, v, iteration)
        writer.flush()
    wandb = get_wandb_writer()
    if wandb:
        wandb.log(finite, iteration)
