"""A real pretrained checkpoint end to end, the way users run it (SmolLM2-135M-Instruct, see
real_checkpoint.py): hf-to-megatron -> logits equal HF's at EndPrompt positions -> preprocess
with its own tokenizer -> train through examples/pretrain_llama3_endprompt.sh with no model flag
(the model comes from the checkpoint: tied embeddings) -> iteration 1's loss equals HF's on that
sample and positions -> megatron-to-hf -> with ``s = 1`` and a tiny learning rate, greedy answers
to fixed chat questions equal the original model's, unscaled -> one more launch with LoRA
adapters (``LORA_RANK``) on the same data: iteration 1 equals the full run's (``B = 0``), the save
holds the base bit for bit and trained adapters only, and the merged export is the Megatron model
with its adapters.

``L = L0 = 8192`` (the model's own window, ``s = 1``: no interpolation, terminal positions at the
window's end), so the original model is compared as it is, with no RoPE scaling on either side.
Sizes are kept small for 2 CPU cores: one training sample of P = 64 tokens, two iterations at
lr 1e-7, no optimizer state saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.support.checkpoint_model import causal_logits, checkpoint_model

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")
P, L, L0, S = 64, 8192, 8192, 1.0  # L = L0: s = 1
LORA_RANK = 4
QUESTIONS = ("What is the capital of France?", "Name a primary colour.",
             "How many legs does a spider have?")
#: One document of ~1.5 P tokens: exactly one training sample (windows of P + 1, stride P).
TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lamp "
        "and a notebook in which he wrote the colour of the sea, the direction of the wind and "
        "the names of the ships that passed the rocks below the tower. In the winter the storms "
        "came from the north, and he kept the fire burning through the night so that the "
        "fishing boats could find the harbour mouth between the two long walls of stone.")


def _hf(path: str, **config):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation="eager", **config).eval()


def _megatron_logits(ckpt: str, ids: torch.Tensor, pos: torch.Tensor,
                     lora_rank: int | None = None) -> torch.Tensor:
    """``[B, T, Vp]`` logits of the checkpoint in ``EndPromptGPTModel`` (TP=1, CPU), with rank
    ``lora_rank`` adapters (alpha = rank, the launcher's default) when given."""
    from megatron_endprompt.conversion.megatron_ckpt import build_gpt_model
    from megatron_endprompt.model import EndPromptGPTModel
    from megatron_endprompt.model.lora import apply_lora
    from megatron_endprompt.model.lora_settings import LoraSettings

    def build(args):
        model = build_gpt_model(args, cls=EndPromptGPTModel, pi_factor=S)
        if lora_rank is None:
            return model
        return apply_lora(model, LoraSettings(rank=lora_rank, alpha=float(lora_rank)))

    with checkpoint_model(ckpt, build) as model:
        return causal_logits(model, ids, pos)


def _answers(model, tokenizer) -> list[list[int]]:
    from megatron_endprompt.evaluation.core.runner import greedy_generate

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                             add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"] for q in QUESTIONS]
    return greedy_generate(model, prompts, max_new_tokens=8, pad_id=tokenizer.eos_token_id,
                           eos_ids=[tokenizer.eos_token_id])


def test_real_checkpoint_end_to_end(run_tool, tmp_path):
    from real_checkpoint import smollm2_hf_dir
    from transformers import AutoTokenizer

    from megatron_endprompt.cli import preprocess as preprocess_cli
    from megatron_endprompt.cli.convert import main as convert_main
    from megatron_endprompt.data.sidecar.sidecar import read_sidecar, sidecar_path
    from megatron_endprompt.data.sidecar.spans import sample_reader
    from megatron_endprompt.demo_train import parse_losses
    from megatron_endprompt.layout import positions_from_record
    from megatron_endprompt.training.loss import read_loss_log

    _T0[0] = time.monotonic()
    hf_dir = smollm2_hf_dir()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)

    _stage('convert')
    # -- convert; logits at EndPrompt positions equal the original HF model's (s = 1) --------
    base = str(tmp_path / "base")
    rc, _, err = run_tool(convert_main, ["hf-to-megatron", "--hf-dir", hf_dir, "--output", base,
                                         "--no-progress"])
    assert rc == 0, err
    ids = torch.as_tensor([tokenizer(TEXT).input_ids[:32]])
    pos = torch.cat((torch.arange(24), torch.arange(L - 8, L)))[None]
    original = _hf(hf_dir)  # as shipped: no RoPE scaling
    with torch.no_grad():
        ref = original(input_ids=ids, position_ids=pos).logits
    mg = _megatron_logits(base, ids, pos)[..., :ref.shape[-1]]
    diff = (mg - ref).abs().max().item()
    _stage(f"max |logit diff| Megatron vs HF at EndPrompt positions: {diff:.2e}")
    assert diff <= 1e-3

    _stage('preprocess')
    # -- preprocess with the model's own tokenizer: one sample ------------------------------
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": TEXT}) + "\n")
    prefix = str(tmp_path / "ep")
    rc, _, err = run_tool(preprocess_cli.main, [
        "--input", corpus, "--output-prefix", prefix, "--tokenizer-type",
        "HuggingFaceTokenizer", "--tokenizer-model", hf_dir, "--seq-length", P,
        "--target-length", L, "--terminal-length", 16, "--placement", "fixed",
        "--terminal-source", "continuation", "--append-eod", "--no-progress"])
    assert rc == 0, err
    sidecar = read_sidecar(sidecar_path(prefix))
    assert sidecar.header.num_samples == 1
    sample = np.asarray(sample_reader(prefix, sidecar)(0), dtype=np.int64)
    positions = positions_from_record(np.asarray(sidecar.records)[0], P)
    assert positions[-1] == L - 1  # the terminal ends at L - 1

    _stage('train')
    # -- train through the launcher, no model flag --------------------------------------------
    out, losses = str(tmp_path / "out"), str(tmp_path / "losses")
    env = {**os.environ, "PYTHON": sys.executable,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "CHECKPOINT_IN": base, "CHECKPOINT_OUT": out, "TOKENIZER": hf_dir,
           "DATA_PREFIX": prefix, "GPUS_PER_NODE": "1", "TP": "1", "MICRO_BATCH": "1",
           "GLOBAL_BATCH": "1", "TRAIN_ITERS": "2", "LR": "1e-7", "WARMUP_ITERS": "0",
           "SEQ_LENGTH": str(P), "TARGET_LENGTH": str(L), "SPLIT": "100,0,0",
           "EVAL_ITERS": "0", "SAVE_INTERVAL": "2", "PRECISION": "fp32",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "2"}
    cpu = ["--transformer-impl", "local", "--num-workers", "0", "--no-save-optim",
           "--no-save-rng"]
    dry = subprocess.run(["bash", SCRIPT, "--dry-run", *cpu], env=env, capture_output=True,
                         text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "--untie-embeddings-and-output-weights" not in dry.stdout  # tied, from the record
    words = dry.stdout.split()
    assert words[words.index("--endprompt-pi-factor") + 1] == "1"  # L = L0 from the record
    text = _launch(tmp_path / "train.log", env, *cpu, "--endprompt-loss-log", losses)
    exact = read_loss_log(losses)
    assert sorted(exact) == sorted(parse_losses(text)) == [1, 2]

    _stage('iteration 1 loss')
    # iteration 1's loss is the original HF model's mean cross-entropy on that sample at its
    # positions (s = 1: no scaling on either side)
    # (continuation terminals: loss weight 1 everywhere, so a plain mean over P predictions)
    with torch.no_grad():
        logits = original(input_ids=torch.as_tensor(sample[None, :P]),
                          position_ids=torch.as_tensor(positions[None])).logits
    hf_loss = torch.nn.functional.cross_entropy(logits[0], torch.as_tensor(sample[1:])).item()
    _stage(f"iteration 1 loss: Megatron {exact[1]:.6f}, HF {hf_loss:.6f}")
    assert exact[1] == pytest.approx(hf_loss, abs=1e-4)

    _stage('export')
    # -- export (s = 1: plain RoPE); greedy chat answers equal the original model's --------
    exported = str(tmp_path / "hf_out")
    rc, _, err = run_tool(convert_main, ["megatron-to-hf", "--checkpoint", out, "--output",
                                         exported, "--tokenizer", hf_dir, "--no-progress"])
    assert rc == 0, err
    model = _hf(exported)
    assert model.config.tie_word_embeddings and model.config.max_position_embeddings == L0
    assert model.config.rope_parameters["rope_type"] == "default"
    new_tokenizer = AutoTokenizer.from_pretrained(exported)
    assert new_tokenizer.chat_template == tokenizer.chat_template
    got, want = _answers(model, new_tokenizer), _answers(original, tokenizer)
    _stage(f"answers: {[tokenizer.decode(a) for a in want]}")
    assert got == want and all(len(a) > 0 for a in want)

    _stage("LoRA")
    # -- LoRA through the launcher, the same data, a learning rate that moves the adapters ----
    lora_out, lora_losses = str(tmp_path / "out_lora"), str(tmp_path / "losses_lora")
    _launch(tmp_path / "train_lora.log",
            {**env, "CHECKPOINT_OUT": lora_out, "LORA_RANK": str(LORA_RANK), "LR": "1e-3",
             "MASTER_PORT": str(_free_port())}, *cpu, "--endprompt-loss-log", lora_losses)
    lora = read_loss_log(lora_losses)
    _stage(f"LoRA losses {lora}; full run's iteration 1 {exact[1]:.6f}")
    assert sorted(lora) == [1, 2]
    assert lora[1] == pytest.approx(exact[1], abs=1e-6)  # B = 0: the full model's loss
    _check_lora_save(lora_out, base)
    merged = str(tmp_path / "hf_lora")
    rc, stdout, err = run_tool(convert_main, ["megatron-to-hf", "--checkpoint", lora_out,
                                              "--output", merged, "--tokenizer", hf_dir,
                                              "--no-progress"])
    assert rc == 0, err
    assert f"LoRA adapters (r={LORA_RANK}, alpha={LORA_RANK}): merged" in stdout, stdout
    model = _hf(merged)
    assert model.config.tie_word_embeddings
    with torch.no_grad():
        got_logits = model(input_ids=ids, position_ids=pos).logits
    adapted = _megatron_logits(lora_out, ids, pos, lora_rank=LORA_RANK)[..., :ref.shape[-1]]
    merge_diff = (got_logits - adapted).abs().max().item()
    effect = (ref - adapted).abs().max().item()
    _stage(f"merged export vs Megatron with adapters: {merge_diff:.2e}; adapters' effect on the "
           f"original's logits: {effect:.2e}")
    # measured: 2.65e-03 against an effect of 5.97 (fp32 rounding of W + B A over 30 layers;
    # a wrong merge, e.g. the GQA interleave of qkv's B, moves logits by the effect's size)
    assert merge_diff <= 1e-2 and effect > 100 * merge_diff
    _stage("done")


def _launch(log_path, env: dict[str, str], *flags: str) -> str:
    """The launcher with ``env`` and extra ``flags``, output to ``log_path``; asserts exit 0 and
    returns the output."""
    with open(log_path, "w") as log:
        proc = subprocess.run(["bash", SCRIPT, *flags], env=env, stdout=log,
                              stderr=subprocess.STDOUT, timeout=900)
    text = log_path.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


def _check_lora_save(saved: str, base: str) -> None:
    """The LoRA run's save holds every tensor of the converted ``base`` bit for bit (tied: no
    output layer of its own), plus ``lora_a``/``lora_b`` of the four linears, every ``B``
    moved off zero."""
    from megatron_endprompt.conversion.megatron_ckpt import (
        find_checkpoint,
        read_tensor,
        single_process_group,
        tensor_metadata,
    )

    trained, converted = find_checkpoint(saved), find_checkpoint(base)
    with single_process_group():
        meta, base_meta = tensor_metadata(trained), tensor_metadata(converted)
        adapters = {k for k in meta if k.endswith((".lora_a", ".lora_b"))}
        assert len(adapters) == 8, sorted(adapters)  # 4 linears x (A, B), layer-stacked
        assert set(meta) - adapters == set(base_meta)
        assert not any("output_layer" in k for k in base_meta)  # tied embeddings
        for key in base_meta:
            assert torch.equal(read_tensor(trained, key, meta[key]),
                               read_tensor(converted, key, base_meta[key])), key
        for key in sorted(adapters):
            if key.endswith(".lora_b"):
                assert read_tensor(trained, key, meta[key]).abs().sum() > 0, key


_T0 = [time.monotonic()]


def _stage(name: str) -> None:
    """A timed line on the real stderr (``run_tool`` captures sys.stdout/sys.stderr)."""
    print(f"[{time.monotonic() - _T0[0]:6.1f} s] {name}", file=sys.__stderr__, flush=True)


def _free_port() -> int:
    from megatron_endprompt.launch import free_port

    return free_port()
