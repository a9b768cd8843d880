"""The real ``megatron.training.pretrain`` through our entry point, CPU + gloo + torchrun.

Parity: one checkpoint, loaded with ``--finetune`` under TP=1, TP=2, PP=2, PP=2 with virtual
stages and DP=2 with the distributed optimizer: the first iteration's loss (same weights,
same global batch, EndPrompt positions and weights) agrees within 1e-5 relative, on one blend of
random-placement, PoSE and ET(PoSE) samples.
Resume: DP=2's run goes on to 6 iterations with a save at 3; resuming from 3 reproduces
iterations 4-6 exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_endprompt.demo_train import parse_losses, run_pretrain
from tests.support.megatron_flags import tiny_llama_flags
from megatron_endprompt.training.loss import read_loss_log
from megatron_endprompt.data.prepare.motif_corpus import write_motif_prefix

pytestmark = pytest.mark.process

P, L, VOCAB = 64, 512, 1000
MODEL = tiny_llama_flags(layers=4, seq_length=P, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return write_motif_prefix(str(tmp_path_factory.mktemp("pt")), seq_length=P, target_length=L,
                              vocab=VOCAB, placement="random", pose_chunks=2,
                              terminal_loss_weight=0.3)


def _args(data, tmp, *extra):
    """``data``: one prefix, or ``--data-path`` words (a blend: all of it trains, since an
    empty blended validation split is refused at ``--eval-iters 0``)."""
    words, split = ([data], "90,5,5") if isinstance(data, str) else (data, "100,0,0")
    return [*MODEL, "--data-path", *words, "--split", split,
            "--data-cache-path", str(tmp / "cache"), "--endprompt-target-length", str(L),
            "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
            "--min-lr", "1e-3", "--lr-decay-style", "constant", "--clip-grad", "1.0",
            "--seed", "1234", "--calculate-per-token-loss", "--log-interval", "1",
            "--eval-iters", "0", "--eval-interval", "1000", "--num-workers", "0",
            "--ckpt-format", "torch_dist", *extra]


def _run(prefix, tmp, name, *extra, nproc=2):
    rc, log = run_pretrain(_args(prefix, tmp, *extra), log_path=str(tmp / f"{name}.log"),
                           nproc=nproc)
    assert rc == 0, log[-3000:]
    return parse_losses(log)


@pytest.fixture(scope="module")
def pose_prefixes(tmp_path_factory) -> dict[str, str]:
    """``--placement pose``: PoSE itself (continuation, b = 1, uniform loss) and ET(PoSE) with
    PoSE's law (a 6-token prompt at ``L - b``, w = 0.1)."""
    from megatron_endprompt.data.sidecar.terminal_spec import TerminalSpec

    prefixes = {}
    for name in ("pose", "et_pose"):
        root = tmp_path_factory.mktemp(name)
        if name == "pose":
            terminal, w = TerminalSpec(source="continuation", length=1), 1.0
        else:
            (root / "prompt.txt").write_text("7 8 9 10 11 12\n")
            terminal, w = TerminalSpec(source="prompt", prompts=str(root / "prompt.txt")), 0.1
        prefixes[name] = write_motif_prefix(str(root), seq_length=P, target_length=L,
                                            vocab=VOCAB, placement="pose", pose_chunks=2,
                                            terminal=terminal, terminal_loss_weight=w)
    return prefixes


@pytest.fixture(scope="module")
def blend(prefix, pose_prefixes) -> list[str]:
    """``--data-path`` words: random placement, PoSE and ET(PoSE), weight 1 each. Megatron's
    blend takes them in turn (samples 0, 1, 2 = random, PoSE, ET(PoSE), ...), so the pins'
    global batch of 8 holds all three and every micro-batch of 2 mixes two of them."""
    return ["1", prefix, "1", pose_prefixes["pose"], "1", pose_prefixes["et_pose"]]


@pytest.fixture(scope="module")
def base_checkpoint(prefix, tmp_path_factory) -> str:
    """The checkpoint every parallel-layout pin starts from (1 iteration on ``prefix``, one
    rank): a pin needs *a* trained checkpoint that all its layouts load, not one per data set."""
    tmp = tmp_path_factory.mktemp("base")
    base = str(tmp / "base")
    _run(prefix, tmp, "base", "--train-iters", "1", "--save", base, "--save-interval", "1",
         nproc=1)
    return base


@pytest.fixture(scope="module")
def hybrid_run(prefix, tmp_path_factory) -> tuple[str, str]:
    """``--hybrid-layer-pattern "*-*-"`` trained 4 iterations on one rank: ``(save dir, log)``.
    One run serves the training test and, as the checkpoint to load, the PP pin."""
    tmp = tmp_path_factory.mktemp("hybrid")
    save = str(tmp / "hybrid_ckpt")
    rc, log = run_pretrain(_args(prefix, tmp, "--train-iters", "4", "--save", save,
                                 "--save-interval", "4", "--hybrid-layer-pattern", "*-*-",
                                 "--lr", "3e-3"),
                           log_path=str(tmp / "hybrid.log"), nproc=1)
    assert rc == 0, log[-3000:]
    return save, log


#: The resume test's layout (and the parity pin's DP=2 layout), 6 iterations
DP2 = ["--use-distributed-optimizer", "--train-iters", "6"]


@pytest.fixture(scope="module")
def dp2_run(blend, base_checkpoint, tmp_path_factory) -> tuple[Path, str]:
    """DP=2 with the distributed optimizer (the CPU runtime's torch-Adam fallback), loaded from
    ``base_checkpoint`` with ``--finetune``, 6 iterations with a save at 3: ``(tmp dir,
    checkpoint dir)``. Its first loss is the DP=2 parity pin; its save is the resume test's."""
    tmp = tmp_path_factory.mktemp("dp2")
    ckpt = str(tmp / "ckpt")
    _run(blend, tmp, "full", *DP2, "--load", base_checkpoint, "--finetune", "--save", ckpt,
         "--save-interval", "3", "--endprompt-loss-log", str(tmp / "full_losses"))
    return tmp, ckpt


def test_parallel_layouts_agree_with_single_rank(blend, pose_prefixes, base_checkpoint, dp2_run,
                                                 tmp_path):
    """TP=2, PP=2, PP=2 with virtual stages and DP=2 with the distributed optimizer give the
    single-rank first loss from one checkpoint (1e-5 relative), on the blend: random-placement
    samples (per-row RoPE freqs), PoSE and ET(PoSE) samples (text skips, one sample per
    document; TP=2 broadcasts their positions within the group, PP=2 hands them to every
    stage)."""
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path

    for pose_prefix in pose_prefixes.values():
        sc = read_sidecar(sidecar_path(pose_prefix), prefix=pose_prefix)
        assert sc.layout.placement == "pose" and sc.header.stats["pose"]["text_skip_mean"] > 0
    load = ["--load", base_checkpoint, "--finetune", "--train-iters", "1"]

    def first_loss(name, *flags, nproc=2):
        logdir = str(tmp_path / f"{name}_losses")
        _run(blend, tmp_path, name, *load, *flags, "--endprompt-loss-log", logdir,
             nproc=nproc)
        return read_loss_log(logdir)[1]

    ref = first_loss("tp1", nproc=1)
    layouts = {
        "tp2": ["--tensor-model-parallel-size", "2"],
        "pp2": ["--pipeline-model-parallel-size", "2"],
        "vpp": ["--pipeline-model-parallel-size", "2",
                "--num-layers-per-virtual-pipeline-stage", "1"],
    }
    got = {name: first_loss(name, *flags) for name, flags in layouts.items()}
    got["dp2_distopt"] = read_loss_log(str(dp2_run[0] / "full_losses"))[1]
    for name, loss in got.items():
        assert abs(loss - ref) <= 1e-5 * abs(ref), (name, loss, ref)


def test_resume_reproduces_uninterrupted_run(blend, dp2_run):
    """DP=2 + distributed optimizer (the CPU runtime's torch-Adam fallback: its state
    template, the no-grad copies and the Adam step) through the EndPrompt entry: the optimizer
    state survives the round trip, iterations 4-6 bit-exact. Compared on the exact loss log:
    Megatron's printed value is a 7-digit running average."""
    tmp, ckpt = dp2_run
    _run(blend, tmp, "resumed", *DP2, "--load", ckpt, "--ckpt-step", "3",
         "--endprompt-loss-log", str(tmp / "resumed_losses"))
    full = read_loss_log(str(tmp / "full_losses"))
    resumed = read_loss_log(str(tmp / "resumed_losses"))
    assert sorted(full) == [1, 2, 3, 4, 5, 6] and sorted(resumed) == [4, 5, 6]
    assert [resumed[i] for i in (4, 5, 6)] == [full[i] for i in (4, 5, 6)]
    assert full[6] < full[1], "the loss falls"
    terms = read_loss_log(str(tmp / "full_losses"), "terminal loss")
    assert sorted(terms) == sorted(full), "terminal loss logged separately"


def test_mismatched_target_length_is_refused(prefix, tmp_path):
    args = _args(prefix, tmp_path, "--train-iters", "1")
    args[args.index("--endprompt-target-length") + 1] = "1024"
    rc, log = run_pretrain(args, log_path=str(tmp_path / "bad.log"), nproc=1)
    assert rc != 0
    assert "built for target length L=512 but training says --endprompt-target-length 1024" in log


def test_transformer_engine_impl_on_cpu_is_refused_in_one_line(prefix, tmp_path):
    """Before the check: a traceback from Megatron's TE layer spec (TE absent here)."""
    rc, log = run_pretrain(_args(prefix, tmp_path, "--train-iters", "1", "--transformer-impl",
                                 "transformer_engine"), log_path=str(tmp_path / "te.log"), nproc=1)
    assert rc != 0
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--transformer-impl transformer_engine needs a CUDA GPU" in \
        errors[0], log[-3000:]
    # the one traceback left is torchrun's own report of the child's exit code 2
    assert log.count("Traceback (most recent call last)") == log.count("raise ChildFailedError(")


def test_mtp_trains_on_endprompt_weights(prefix, tmp_path):
    """``--mtp-num-layers 1``: the provider builds Megatron's MTP block (last stage) and the
    forward step hands it the EndPrompt weights; the run trains and logs the MTP loss."""
    logdir = str(tmp_path / "mtp_losses")
    rc, log = run_pretrain(_args(prefix, tmp_path, "--train-iters", "2", "--mtp-num-layers", "1",
                                 "--endprompt-loss-log", logdir),
                           log_path=str(tmp_path / "mtp.log"), nproc=1)
    assert rc == 0, log[-3000:]
    assert "L=512 L0=64 (--max-position-embeddings) s=8" in log
    assert "mtp_1 loss" in log
    assert sorted(read_loss_log(logdir)) == [1, 2]


def test_hybrid_model_trains_with_endprompt_positions(hybrid_run):
    """``--hybrid-layer-pattern "*-*-"``: the provider builds Megatron-Core's HybridModel
    (GPTModel's successor) with EndPrompt RoPE over the same local layer spec; the real trainer
    runs it with EndPrompt positions and weights, and the checkpoint is HybridModel's."""
    import glob

    save, log = hybrid_run
    assert "L=512 L0=64 (--max-position-embeddings) s=8" in log
    losses = parse_losses(log)
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1], losses
    metadata = b""
    for path in glob.glob(f"{save}/iter_*/.metadata"):
        with open(path, "rb") as f:
            metadata += f.read()
    assert b"decoder.final_norm.weight" in metadata and b"final_layernorm" not in metadata


def test_hybrid_pipeline_parallel_agrees_with_single_rank(prefix, hybrid_run, tmp_path):
    """HybridModel under PP=2 (positions handed to RoPE on the stage without the embedding too)
    gives the single-rank first loss from the same checkpoint (the trained hybrid run's)."""
    hybrid = ["--hybrid-layer-pattern", "*-*-"]
    load = [*hybrid, "--load", hybrid_run[0], "--finetune", "--train-iters", "1"]

    def first_loss(name, *flags, nproc):
        logdir = str(tmp_path / f"{name}_losses")
        _run(prefix, tmp_path, name, *load, *flags, "--endprompt-loss-log", logdir, nproc=nproc)
        return read_loss_log(logdir)[1]

    ref = first_loss("h_pp1", nproc=1)
    got = first_loss("h_pp2", "--pipeline-model-parallel-size", "2", nproc=2)
    assert abs(got - ref) <= 1e-5 * abs(ref), (got, ref)
