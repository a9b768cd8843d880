"""The sweep's table, part 3: merges that must know their shard set, writes that must
not overwrite an input or another prefix's sidecar, and vocabularies that must not mix.

Every case here once exited 0 (a wrong success or data loss); each must
now be one ``error:`` line naming the flag, leaving its directory byte-identical."""

from __future__ import annotations

import os
import shutil

from sweep import Case
from sweep_fixtures import SUFFIXES, preprocess_argv, quiet_cli


def _shards(fx, seed: int) -> list[str]:
    """Three shards of one partitioned run (built once per seed, under the fixtures)."""
    from megatron_endprompt.cli import preprocess as preprocess_cli

    cache = fx.__dict__.setdefault("shards27", {})
    if seed not in cache:
        out = os.path.join(fx.root, f"shards_seed{seed}", "a")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        for i in range(3):
            quiet_cli(preprocess_cli.main, preprocess_argv(
                out, fx.corpus, fx.spm, "--placement", "random", "--seed", str(seed),
                "--partitions", "3", "--partition-index", str(i)))
        cache[seed] = [f"{out}_part{i}_of_3" for i in range(3)]
    return cache[seed]


def _copy(src: str, dst: str, suffixes=SUFFIXES) -> str:
    for s in suffixes:
        shutil.copyfile(src + s, dst + s)
    return dst


def _shards_in(fx, d, seed=7, sub="sh") -> list[str]:
    os.makedirs(os.path.join(d, sub), exist_ok=True)
    return [_copy(p, os.path.join(d, sub, os.path.basename(p))) for p in _shards(fx, seed)]


def merge_argv(inputs, out, *extra):
    return ["--inputs", *inputs, "--output-prefix", out, *extra]


def _into_symlinked_input(fx, d):
    parts = _shards_in(fx, d)
    os.symlink("sh", os.path.join(d, "shlink"))
    return merge_argv(parts, os.path.join(d, "shlink", os.path.basename(parts[1])))


def _two_of_three(fx, d):
    parts = _shards_in(fx, d)
    return merge_argv([parts[0], parts[2]], os.path.join(d, "m"))


def _twice(fx, d):
    parts = _shards_in(fx, d)
    return merge_argv([parts[0], parts[1], parts[1], parts[2]], os.path.join(d, "m"))


def _twice_through_link(fx, d):
    parts = _shards_in(fx, d)
    os.symlink("sh", os.path.join(d, "shlink"))
    again = os.path.join(d, "shlink", os.path.basename(parts[1]))
    return merge_argv([parts[0], parts[1], again, parts[2]], os.path.join(d, "m"))


def _two_runs(fx, d):
    a = _shards_in(fx, d, seed=7, sub="run7")
    b = _shards_in(fx, d, seed=8, sub="run8")
    return merge_argv([a[0], b[1], a[2]], os.path.join(d, "m"))


def _out_of_order(fx, d):
    parts = _shards_in(fx, d)
    return merge_argv([parts[1], parts[0], parts[2]], os.path.join(d, "m"))


def _sidecar_argv(prefix, *extra):
    from sweep_fixtures import B, L, P

    return ["--data-prefix", prefix, "--seq-length", str(P), "--target-length", str(L),
            "--terminal-length", str(B), "--no-progress", *extra]


def _no_identity(fx, d):
    """Two Megatron corpora of different tokenizers, sidecars built without a tokenizer."""
    from megatron_endprompt.cli import build_sidecar as sidecar_cli

    a = _copy(fx.good, os.path.join(d, "spm"), (".bin", ".idx"))
    b = _copy(fx.null, os.path.join(d, "null"), (".bin", ".idx"))
    for prefix in (a, b):
        quiet_cli(sidecar_cli.main, _sidecar_argv(prefix))
    return merge_argv([a, b], os.path.join(d, "m"))


def _merge_named_into_existing(fx, d):
    """``--name`` merge onto a prefix that holds another corpus with its own sidecar."""
    parts = _shards_in(fx, d)
    from megatron_endprompt.data.sidecar.sidecar import sidecar_path

    for p in parts:
        shutil.copyfile(p + ".endprompt", sidecar_path(p, "n"))
    existing = os.path.join(d, "data")  # another corpus: the 15-document one
    _small(fx, existing)
    return merge_argv(parts, existing, "--name", "n")


def _small(fx, prefix):
    from megatron_endprompt.cli import preprocess as preprocess_cli

    quiet_cli(preprocess_cli.main, preprocess_argv(prefix, fx.small_corpus, fx.spm))


def _pp_named_onto_other_corpus(fx, d):
    prefix = _copy(fx.good, os.path.join(d, "data"))
    return preprocess_argv(prefix, fx.small_corpus, fx.spm, "--name", "other")


def _sc_name_is_other_prefix(fx, d):
    col = _copy(fx.good, os.path.join(d, "col"))
    _copy(fx.good, os.path.join(d, "col.x"))
    return _sidecar_argv(col, "--name", "x")


def _pp_default_is_named_sidecar(fx, d):
    """Preprocessing a new prefix ``col.x`` would replace ``col``'s sidecar named ``x``."""
    col = _copy(fx.good, os.path.join(d, "col"))
    shutil.copyfile(fx.good + ".endprompt", col + ".x.endprompt")
    return preprocess_argv(col + ".x", fx.small_corpus, fx.spm)


def _sc_prompt_small_vocab(fx, d):
    prefix = _copy(fx.good, os.path.join(d, "data"), (".bin", ".idx"))
    return _sidecar_argv(prefix, "--name", "p", "--terminal-source", "prompt",
                         "--tokenizer-type", "GPTSentencePieceTokenizer",
                         "--tokenizer-model", fx.spm_small)


CASES: list[Case] = [
    Case("mg_output_is_input_through_symlink", "merge", _into_symlinked_input, item="27",
         needle="--output-prefix"),
    Case("mg_missing_shard", "merge", _two_of_three, item="27", needle="missing"),
    Case("mg_shard_twice", "merge", _twice, item="27", needle="twice"),
    Case("mg_shard_twice_through_symlink", "merge", _twice_through_link, item="27",
         needle="twice"),
    Case("mg_shards_of_two_runs", "merge", _two_runs, item="27", needle="another"),
    Case("mg_shards_out_of_order", "merge", _out_of_order, item="27", needle="order"),
    Case("mg_corpora_without_tokenizer", "merge", _no_identity, item="27",
         needle="records no tokenizer"),
    Case("mg_named_onto_other_corpus", "merge", _merge_named_into_existing, item="27",
         needle="sidecar data.endprompt"),
    Case("pp_named_onto_other_corpus", "preprocess", _pp_named_onto_other_corpus, item="27",
         needle="sidecar data.endprompt"),
    Case("sc_name_is_other_prefixs_sidecar", "sidecar", _sc_name_is_other_prefix, item="27",
         needle="--name x"),
    Case("pp_default_sidecar_is_named_one", "preprocess", _pp_default_is_named_sidecar,
         item="27", needle="sidecar named 'x'"),
    Case("sc_prompt_tokenizer_smaller_vocab", "sidecar", _sc_prompt_small_vocab, item="27",
         needle="--tokenizer-model"),
]
