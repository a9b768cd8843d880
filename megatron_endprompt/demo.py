"""The quick start (``make demo``): the main job on the embedded default, on a CPU.

generate a corpus -> train a SentencePiece tokenizer on it -> preprocess it into Megatron
``.bin/.idx`` + EndPrompt sidecar (fixed placement with a continuation terminal, and random
placement with prompt terminals and ET(PoSE)) -> inspect samples -> build train/valid/test
datasets through Megatron's ``BlendedMegatronDatasetBuilder`` (EndPrompt + plain replay
blend) -> train a tiny Llama with Megatron's real ``pretrain`` under ``torchrun`` (2 CPU
processes, TP=2 by default, gloo) and show that the loss falls -> export the checkpoint to a
Hugging Face directory -> evaluate it at length (RULER's synthetic subset, passkey, the NIAH
heatmap, per-document perplexity and its plot).
"""

from __future__ import annotations

import argparse
import os

from megatron_endprompt import runtime
from megatron_endprompt.cli import convert, inspect, preprocess
from megatron_endprompt.cli import eval as evaluate
from megatron_endprompt.cli.kit import entry
from megatron_endprompt.data.prepare.synthetic import train_sentencepiece, write_corpus
from megatron_endprompt.data.tokenize.tokenizer import TokenizerSpec, build_tokenizer
from megatron_endprompt.errors import run_cli


def _run_tool(main, argv: list[str]) -> None:
    print(f"\n$ {main.__module__.split('.')[-1]} {' '.join(argv)}", flush=True)
    rc = run_cli(main, argv)
    if rc:
        raise SystemExit(rc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="demo_out")
    p.add_argument("--docs", type=int, default=400)
    p.add_argument("--seq-length", type=int, default=256)
    p.add_argument("--target-length", type=int, default=2048)
    p.add_argument("--train-iters", type=int, default=40)
    p.add_argument("--parallel", choices=["tp2", "pp2", "none"], default="tp2",
                   help="model-parallel layout of the demo training (2 processes)")
    p.add_argument("--skip-train", action="store_true")
    args = p.parse_args(argv)

    runtime.quiet()
    os.makedirs(args.workdir, exist_ok=True)
    w = lambda name: os.path.join(args.workdir, name)  # noqa: E731
    corpus = write_corpus(w("corpus.jsonl"), num_docs=args.docs, seed=0)
    spm = train_sentencepiece(corpus, w("tokenizer"), vocab_size=512)
    print(f"generated {args.docs} documents in {corpus}; tokenizer {spm}")
    common = ["--input", corpus, "--tokenizer-type", "GPTSentencePieceTokenizer",
              "--tokenizer-model", spm, "--seq-length", str(args.seq_length),
              "--target-length", str(args.target_length), "--append-eod", "--workers", "2",
              "--no-progress"]
    _run_tool(preprocess.main, common + ["--output-prefix", w("endprompt_fixed"),
                                         "--terminal-source", "continuation",
                                         "--terminal-length", "32", "--placement", "fixed"])
    _run_tool(preprocess.main, common + ["--output-prefix", w("endprompt_prompt_pose"),
                                         "--terminal-source", "prompt", "--placement", "random",
                                         "--pose-chunks", "2", "--terminal-loss-weight", "0.1"])
    _run_tool(inspect.main, [w("endprompt_fixed"), "--index", "0"])
    _run_tool(inspect.main, [w("endprompt_prompt_pose"), "--index", "1"])
    _show_datasets(args, w, spm)
    if not args.skip_train:
        # lazy: spares torch at start-up (--skip-train never trains)
        from megatron_endprompt.demo_train import train_tiny

        losses = train_tiny(workdir=args.workdir, tokenizer_model=spm,
                            data_prefixes=[w("endprompt_fixed"), w("endprompt_prompt_pose")],
                            seq_length=args.seq_length, target_length=args.target_length,
                            train_iters=args.train_iters, parallel=args.parallel)
        first, last = losses[min(losses)], losses[max(losses)]
        print(f"training loss: iteration {min(losses)} {first:.4f} -> iteration "
              f"{max(losses)} {last:.4f} ({'falls' if last < first else 'DOES NOT FALL'})")
        _run_tool(convert.main, ["megatron-to-hf", "--checkpoint", w("checkpoints"),
                                 "--output", w("hf_export"), "--overwrite", "--no-progress"])
        _evaluate(args, w, corpus)
    print(f"\ndemo done: outputs in {args.workdir}/")
    return 0


#: The RULER subset the demo runs at L/2 and L (one prompt each, 128 generated tokens for
#: NIAH): retrieval on the noise, essay and distractor-needle haystacks, multi-value, and both
#: aggregation tasks. ``vt`` is left out: its in-context example alone needs ~1.2K tokens
#: under the demo's 512-piece tokenizer.
DEMO_RULER_TASKS = "niah_single_1,niah_single_2,niah_multikey_2,niah_multivalue,cwe,fwe"


def _long_documents(corpus: str, path: str, *, per_doc: int = 40) -> str:
    """PG19-style long documents for the per-document PPL: every ``per_doc`` corpus documents
    joined into one (the corpus's own documents are shorter than the evaluated lengths)."""
    import json

    with open(corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, len(texts) - per_doc + 1, per_doc):
            f.write(json.dumps({"text": " ".join(texts[i:i + per_doc])}) + "\n")
    return path


def _evaluate(args, w, corpus: str) -> None:
    """The exported model at length: RULER's synthetic subset at L/2 and L (essay tasks on the
    shipped substitute haystack), passkey at three depths, per-document PPL; the heatmap and
    the PPL plot."""
    half, full = str(args.target_length // 2), str(args.target_length)
    _run_tool(evaluate.main, [
        "--hf-dir", w("hf_export"), "--tasks", DEMO_RULER_TASKS, "--lengths", f"{half},{full}",
        "--samples", "1", "--seed", "0", "--device", "cpu", "--output", w("eval/ruler.json"),
        "--save-prompts", w("eval/ruler_prompts.jsonl"), "--no-progress"])
    _run_tool(evaluate.main, [
        "--hf-dir", w("hf_export"), "--tasks", "passkey,ppl",
        "--lengths", f"{args.seq_length},{half},{full}", "--depths", "0,0.5,1",
        "--samples", "1", "--seed", "0", "--device", "cpu",
        "--ppl-data", _long_documents(corpus, w("eval/ppl_docs.jsonl")),
        "--ppl-max-windows", "4", "--output", w("eval/results.json"), "--no-progress"])
    print(f"RULER subset: {w('eval/ruler.md')}; NIAH heatmaps: {w('eval/ruler_niah.png')}, "
          f"{w('eval/results_niah.png')}; PPL plot: {w('eval/results_ppl.png')}")


def _show_datasets(args, w, spm: str) -> None:
    """Build datasets the way ``pretrain`` will and print one batch's shapes and layouts."""
    import numpy as np
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder

    # lazy: spares torch and Megatron at start-up (--help, the corpus and preprocessing steps)
    from megatron_endprompt.data.dataset import EndPromptDatasetConfig, EndPromptGPTDataset

    tok = build_tokenizer(TokenizerSpec(tokenizer_type="GPTSentencePieceTokenizer",
                                        tokenizer_model=spm))
    config = EndPromptDatasetConfig(
        random_seed=1234, sequence_length=args.seq_length, split="90,5,5", tokenizer=tok,
        blend=([w("endprompt_fixed"), w("endprompt_prompt_pose")], [0.7, 0.3]),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        create_attention_mask=False, path_to_cache=w("index_cache"),
        endprompt_target_length=args.target_length,
    )
    train, valid, test = BlendedMegatronDatasetBuilder(
        EndPromptGPTDataset, [64, 8, 8], lambda: True, config).build()
    print(f"\ndatasets via BlendedMegatronDatasetBuilder: train {len(train)}, valid "
          f"{len(valid)}, test {len(test)} samples")
    for i in range(4):
        s = train[i]
        pos = s["position_ids"].numpy()
        jumps = np.flatnonzero(np.diff(pos) != 1) + 1
        print(f"  train[{i}] from dataset {int(s['dataset_id'])}: "
              f"tokens {tuple(s['tokens'].shape)} "
              f"max position {pos.max()}, jumps at tokens {jumps.tolist()}, "
              f"loss weights {sorted(set(np.round(s['loss_mask'].numpy(), 3).tolist()))}")


#: the ``endprompt-demo`` console script: bad input is one ``error:`` line, exit 2
cli = entry(main)


if __name__ == "__main__":
    cli()
