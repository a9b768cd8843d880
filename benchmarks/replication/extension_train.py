"""Extension fine-tuning of the extension protocol, in process: the product's samples, a plain
PyTorch loop on the exported model.

Why not Megatron's ``pretrain`` here: on the shared 2-core machine one torchrun launch costs
~75 s before its first step, and the protocol trains 6 rows x 15 seeds. The base is still
pretrained by Megatron (``extension.py``); each row starts from its Hugging Face export with PI
(``convert megatron-to-hf --target-length L --pi-factor s``, the converter's tested
equivalence), and trains on exactly the arrays Megatron's EndPrompt dataset would feed it:
a sidecar row's samples are read with ``spans.sample_reader`` and assembled by
``assemble.assemble_sample`` (tokens, labels, positions, per-token loss weights), the
full-length row reads ``L + 1``-token windows of the packed stream with contiguous positions
(Megatron's packing, stride ``L``). The loss is Megatron's ``--calculate-per-token-loss``:
``sum(weight x CE) / sum(weight)`` over the step's samples. Adam (0.9, 0.999), weight decay,
linear warm-up then cosine to LR / 10, gradient clipping at 1.0, as ``run.train_argv`` sets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import numpy as np

from megatron_endprompt.data.assemble import SampleRules, assemble_sample
from megatron_endprompt.data.sidecar.indexed_io import IndexReader
from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
from megatron_endprompt.data.sidecar.spans import sample_reader

Batch = dict[str, np.ndarray]


def sidecar_batches(prefix: str, *, per_step: int, seed: int) -> Iterator[Batch]:
    """Batches ``[per_step, P]`` of a sidecar prefix's samples in a seeded shuffled order
    (reshuffled each epoch), assembled as the EndPrompt dataset assembles them."""
    sc = read_sidecar(sidecar_path(prefix), prefix=prefix)
    rules = SampleRules(seq_length=sc.layout.seq_length, weights=sc.layout.loss_weights,
                        prompt_terminal=sc.header.terminal_source == "prompt")
    read = sample_reader(prefix, sc)
    records = np.asarray(sc.records)
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while True:
        if len(order) < per_step:
            order += rng.permutation(len(records)).tolist()
        take, order = order[:per_step], order[per_step:]
        arrays = [assemble_sample(np.asarray(read(i), dtype=np.int64), records[i], rules)
                  for i in take]
        yield {k: np.stack([a[k] for a in arrays]) for k in
               ("tokens", "labels", "loss_mask", "position_ids")}


def packed_batches(prefix: str, *, length: int, per_step: int, seed: int) -> Iterator[Batch]:
    """Batches ``[per_step, length]`` of a plain prefix's token stream cut into windows of
    ``length + 1`` tokens (stride ``length``), contiguous positions, every label trained."""
    idx = IndexReader(prefix + ".idx")
    stream = np.fromfile(prefix + ".bin", dtype=idx.dtype).astype(np.int64)
    n = (len(stream) - 1) // length
    rng = np.random.default_rng(seed)
    order: list[int] = []
    pos = np.arange(length, dtype=np.int64)
    while True:
        if len(order) < per_step:
            order += rng.permutation(n).tolist()
        take, order = order[:per_step], order[per_step:]
        win = np.stack([stream[i * length:i * length + length + 1] for i in take])
        yield {"tokens": win[:, :-1], "labels": win[:, 1:],
               "loss_mask": np.ones((len(take), length), dtype=np.float32),
               "position_ids": np.broadcast_to(pos, (len(take), length)).copy()}


def lr_at(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine from ``lr`` to ``lr / 10``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr / 10 + (lr - lr / 10) * 0.5 * (1 + math.cos(math.pi * frac))


def finetune(model, batches: Iterator[Batch], *, steps: int, lr: float, warmup: int,
             seed: int) -> dict:
    """Train ``model`` (an HF causal LM, float32) for ``steps`` optimizer steps, one batch
    each; returns ``{"losses": {step: loss}, "step_ms", "train_wall_s"}``."""
    import torch  # the protocol's orchestration imports this module before it needs torch

    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    losses, times, t_all = {}, [], time.time()
    for step in range(steps):
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr=lr, warmup=warmup, steps=steps)
        b = next(batches)
        logits = model(input_ids=torch.from_numpy(b["tokens"]),
                       position_ids=torch.from_numpy(b["position_ids"])).logits
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                               torch.from_numpy(b["labels"]).flatten(),
                                               reduction="none")
        w = torch.from_numpy(np.ascontiguousarray(b["loss_mask"])).flatten()
        loss = (ce * w).sum() / w.sum().clamp_min(1e-8)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.time() - t0)
        if step % 10 == 0 or step == steps - 1:
            losses[str(step + 1)] = round(loss.item(), 4)
    model.eval()
    return {"losses": losses, "step_ms": round(1000 * float(np.median(times)), 1),
            "train_wall_s": round(time.time() - t_all, 1)}
