"""Context parallelism pinned to the single-rank run, as TP/PP/DP are: Megatron's real
``pretrain`` through our entry, CPU + gloo, the runtime's CP attention.

One blend holds the four layouts (fixed, random, an EP1-length prompt terminal at w = 0.1,
PoSE), so each iteration's 8 samples mix them and every micro-batch of 2 random-placement or
mixed samples carries per-row ``[S, B, 1, D]`` RoPE freqs. From the same seed (the CPU runtime
keeps the weights layout-independent, as on a GPU): CP=2's iteration losses 1-6, and its
terminal losses, and Megatron's printed losses, equal CP=1's within 1e-5 relative (fp32;
plain SGD, so the gradient's normaliser shows in the losses). A CP=2 save at 3
resumes at CP=2 bit-exact, and at CP=1, CP=2 x TP=2 and CP=2 x PP=2 (world 4) within the same
tolerance; exported to HF, its logits equal the Megatron model's.
"""

from __future__ import annotations

import os

import pytest
import torch

from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix
from megatron_endprompt.demo_train import parse_losses, run_pretrain
from megatron_endprompt.training.loss import read_loss_log
from tests.support.checkpoint_model import causal_logits, checkpoint_model
from tests.support.megatron_flags import tiny_llama_flags

pytestmark = pytest.mark.process

P, L, VOCAB = 64, 512, 1000
MODEL = tiny_llama_flags(layers=4, seq_length=P, vocab_size=VOCAB)
#: fp32 relative tolerance of a layout against the single-rank run (summation order only)
RTOL = 1e-5
#: Plain SGD, no momentum, no clipping: the update is proportional to the gradient, so a wrong
#: loss normaliser (e.g. not summed over CP) moves the losses (Adam and clipping hide its
#: scale), and the optimizer has no state: a resume loads model, data position and RNG and skips
#: the optimizer (Megatron-Core's SGD cannot load a ``torch_dist`` state: no ``init_state_fn``).
OPTIMIZER = ["--optimizer", "sgd", "--sgd-momentum", "0", "--lr", "0.1", "--min-lr", "0.1",
             "--lr-decay-style", "constant", "--clip-grad", "0"]
#: EP1's length in words ("This is the end of text, please pay attention here."), as ids
EP1_IDS = " ".join(str(i) for i in range(7, 18))


@pytest.fixture(scope="module")
def blend(tmp_path_factory) -> list[str]:
    """``--data-path`` words: fixed, random, prompt (EP1-length, w = 0.1) and PoSE prefixes,
    weight 1 each."""
    from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec

    root = tmp_path_factory.mktemp("cp_data")
    (root / "ep1.txt").write_text(EP1_IDS + "\n")
    layouts = {
        "fixed": dict(placement="fixed", terminal_loss_weight=0.3),
        "random": dict(placement="random", terminal_loss_weight=0.3),
        "prompt": dict(placement="random", terminal_loss_weight=0.1,
                       terminal=TerminalSpec(source="prompt", prompts=str(root / "ep1.txt"))),
        "pose": dict(placement="pose", pose_chunks=2,
                     terminal=TerminalSpec(source="continuation", length=1)),
    }
    words = []
    for name, layout in layouts.items():
        os.makedirs(root / name)
        words += ["1", write_motif_prefix(str(root / name), seq_length=P, target_length=L,
                                          vocab=VOCAB, **layout)]
    return words


def _train(blend, tmp, name, *extra, nproc) -> dict[str, dict[int, float]]:
    """One launch; returns the exact ``lm loss`` and ``terminal loss`` per iteration."""
    logdir = str(tmp / f"{name}_losses")
    args = [*MODEL, "--data-path", *blend, "--split", "90,5,5",
            "--data-cache-path", str(tmp / "cache"), "--endprompt-target-length", str(L),
            "--micro-batch-size", "2", "--global-batch-size", "8", *OPTIMIZER,
            "--seed", "1234", "--calculate-per-token-loss", "--log-interval", "1",
            "--eval-iters", "1", "--eval-interval", "1000", "--num-workers", "0",
            "--ckpt-format", "torch_dist", "--endprompt-loss-log", logdir, *extra]
    rc, log = run_pretrain(args, log_path=str(tmp / f"{name}.log"), nproc=nproc)
    assert rc == 0, log[-3000:]
    losses = {key: read_loss_log(logdir, key) for key in ("lm loss", "terminal loss")}
    losses["printed"] = parse_losses(log)  # Megatron's own reduction over DP x CP, 7 digits
    return losses


def _assert_close(got, want, what):
    """Equal within :data:`RTOL` (plus the 7-digit rounding of Megatron's printed value)."""
    assert sorted(got) == sorted(want), (what, got, want)
    tol = RTOL + (1e-6 if what.endswith("printed") else 0.0)
    for it in want:
        assert abs(got[it] - want[it]) <= tol * abs(want[it]), (what, it, got[it], want[it])


@pytest.fixture(scope="module")
def single_rank(blend, tmp_path_factory):
    """CP=1 on one rank, 6 iterations: the reference."""
    return _train(blend, tmp_path_factory.mktemp("cp1"), "cp1", "--train-iters", "6", nproc=1)


@pytest.fixture(scope="module")
def cp2(blend, tmp_path_factory):
    """CP=2 on two ranks, 6 iterations, saved at 3 and 6: ``(save dir, losses)``."""
    tmp = tmp_path_factory.mktemp("cp2")
    save = str(tmp / "ckpt")
    losses = _train(blend, tmp, "cp2", "--train-iters", "6", "--context-parallel-size", "2",
                    "--save", save, "--save-interval", "3", nproc=2)
    return save, losses


def test_cp2_trains_like_one_rank(single_rank, cp2):
    """Iteration 1 (same weights, same global batch), the 6-iteration log and the terminal loss
    (the terminal of a sample lies in CP rank 0's second chunk) equal the single-rank run's."""
    _, losses = cp2
    assert sorted(losses["lm loss"]) == [1, 2, 3, 4, 5, 6]
    assert losses["lm loss"][6] < losses["lm loss"][1], "the loss falls"
    for key in ("lm loss", "terminal loss", "printed"):
        _assert_close(losses[key], single_rank[key], key)


@pytest.mark.parametrize("name,flags,nproc", [
    ("cp2", ["--context-parallel-size", "2"], 2),
    ("cp1", [], 1),
    ("cp2_tp2", ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2"], 4),
    ("cp2_pp2", ["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 4),
])
def test_cp2_checkpoint_resumes(cp2, blend, tmp_path, name, flags, nproc):
    """Iterations 4-6 resumed from CP=2's save at 3 (model, data position, RNG; the optimizer
    is stateless):
    at CP=2 bit-exact; at CP=1 and at CP=2 x TP=2 / CP=2 x PP=2 (world 4) within 1e-5."""
    save, full = cp2
    got = _train(blend, tmp_path, name, "--train-iters", "6", "--load", save, "--ckpt-step",
                 "3", "--no-load-optim", *flags, nproc=nproc)
    want = {key: {it: full[key][it] for it in (4, 5, 6)} for key in full}
    if name == "cp2":
        assert got == want
    for key in want:
        _assert_close(got[key], want[key], f"{name} {key}")


def _megatron_logits(ckpt_path, input_ids, position_ids, pi_factor):
    """The checkpoint in ``EndPromptGPTModel`` (TP=PP=CP=1, local spec, this process):
    logits ``[B, S, V_padded]``."""
    from megatron_endprompt.conversion.megatron_ckpt import build_gpt_model
    from megatron_endprompt.model import EndPromptGPTModel

    def build(args):
        assert args.context_parallel_size == 2
        return build_gpt_model(args, cls=EndPromptGPTModel, pi_factor=pi_factor)

    with checkpoint_model(ckpt_path, build) as model:
        return causal_logits(model, input_ids, position_ids)


def test_cp2_trained_checkpoint_exports_to_hf(cp2, tmp_path, run_tool):
    """The CP=2-trained checkpoint (CP shards no weight) exported to HF: its logits at EndPrompt
    positions equal the Megatron model's."""
    from megatron_endprompt.cli.convert import main

    save, _ = cp2
    out = str(tmp_path / "hf")
    rc, _, err = run_tool(main, ["megatron-to-hf", "--checkpoint", save, "--output", out,
                                 "--no-progress"])
    assert rc == 0, err
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    ids = torch.randint(0, VOCAB, (1, P), generator=torch.Generator().manual_seed(1))
    pos = torch.cat((torch.arange(40), torch.arange(L - (P - 40), L)))[None]
    mg = _megatron_logits(save, ids, pos, L / P)
    with torch.no_grad():
        ref = hf(input_ids=ids, position_ids=pos).logits
    assert (mg[..., :VOCAB] - ref).abs().max().item() <= 1e-4
