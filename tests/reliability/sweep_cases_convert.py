"""The sweep's conversion table, round 3: an ``--output`` that is, contains or lies inside an
input (compared as files, through symlinks), two runs to one ``--output``, HF checkpoints whose
tensors or config disagree with what a conversion would silently drop, cast or accept, a full
disk inside torch's checkpoint writer, and damaged checkpoint/tokenizer files on the way out."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time

from sweep import HERE, Case
from sweep_cases_more import copy_tree, h2m, m2h


# -- output vs input, by identity ------------------------------------------------------------
def _hf_copy(fx, d, rel="hf"):
    os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
    return copy_tree(fx.hf, d, rel)


def _mg_copy(fx, d, rel="mg"):
    os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
    return copy_tree(fx.mg, d, rel)


def _h2m_over(hf_rel, out_rel, *extra, link=None):
    """hf-to-megatron of a copy of the HF fixture at ``d/hf_rel`` to ``d/out_rel``
    (``link``: ``(name, target_rel)``, a symlink made in ``d`` first)."""
    def build(fx, d):
        hf = _hf_copy(fx, d, hf_rel)
        if link:
            os.symlink(os.path.join(d, link[1]), os.path.join(d, link[0]))
        return h2m(*extra, hf=lambda fx, d: hf, out=lambda fx, d: os.path.join(d, out_rel))(fx, d)
    return build


def _m2h_over(ckpt_rel, out_rel, *extra, tokenizer=False):
    def build(fx, d):
        ckpt = _mg_copy(fx, d, ckpt_rel)
        argv = ["megatron-to-hf", "--checkpoint", ckpt, "--output", os.path.join(d, out_rel),
                "--target-length", "1024", "--no-progress", *extra]
        if tokenizer:  # a copy of the fixture's tokenizer inside the output-to-be
            tok = os.path.join(d, out_rel, "tok")
            os.makedirs(tok)
            shutil.copyfile(os.path.join(fx.hf, "tokenizer.json"),
                            os.path.join(tok, "tokenizer.json"))
            argv += ["--tokenizer", os.path.join(tok, "tokenizer.json")]
        return argv
    return build


OVERLAP = [
    Case("h2m_output_is_hf_dir", "convert", _h2m_over("hf", "hf", "--overwrite"),
         item="36", needle="--output"),
    Case("h2m_output_parent_of_hf_dir", "convert",
         _h2m_over("models/hf", "models", "--overwrite"), item="36", needle="--output"),
    Case("h2m_output_inside_hf_dir", "convert", _h2m_over("hf", "hf/megatron"), item="36",
         needle="--output"),
    Case("h2m_output_symlink_to_hf_dir", "convert",
         _h2m_over("hf", "link", "--overwrite", link=("link", "hf")), item="36",
         needle="--output"),
    Case("h2m_output_parent_via_symlink", "convert",
         _h2m_over("models/hf", "alias", "--overwrite", link=("alias", "models")), item="36",
         needle="--output"),
    Case("m2h_output_is_checkpoint", "convert", _m2h_over("mg", "mg", "--overwrite"),
         item="36", needle="--output"),
    Case("m2h_output_parent_of_checkpoint", "convert",
         _m2h_over("runs/mg", "runs", "--overwrite"), item="36", needle="--output"),
    Case("m2h_output_contains_tokenizer", "convert",
         _m2h_over("mg", "export", "--overwrite", tokenizer=True), item="36",
         needle="--output"),
]


# -- two runs, one --output ------------------------------------------------------------------
def _two_runs(fx, d, argv):
    """Run A (a subprocess) pauses inside its work (at ``build_gpt_model``) until released;
    meanwhile run B (this process) converts to the same ``--output``. Then A finishes.
    Right: B refused (one line), A's checkpoint the only one written (rc 0). Before: both
    exited 0 saying "wrote" and A's rename replaced B's checkpoint."""
    from sweep import run_in_process

    gate = os.path.join(os.path.dirname(d), os.path.basename(d) + ".gate")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    a = subprocess.Popen([sys.executable, os.path.join(HERE, "pause_driver.py"), gate,
                          "megatron_endprompt.conversion.hf_to_megatron", "build_gpt_model",
                          "--", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(gate + ".paused"):
            if a.poll() is not None or time.monotonic() > deadline:
                out, err = a.communicate()
                return a.returncode, f"run A ended before its pause ({a.returncode}):\n{err}"
            time.sleep(0.1)
        rc_b, err_b = run_in_process("convert", argv)
    finally:
        open(gate + ".go", "w").close()
    _, err_a = a.communicate(timeout=600)
    for suffix in (".paused", ".go"):
        os.unlink(gate + suffix)
    if a.returncode != 0:
        return a.returncode, f"run A failed ({a.returncode}):\n{err_a}"
    return rc_b, err_b


def _first_run_output(fx, d, res) -> list[str]:
    """Run A's checkpoint is there, complete, with nothing of either run left beside it."""
    flags = [] if os.path.isfile(os.path.join(d, "mg", "latest_checkpointed_iteration.txt")) \
        else ["data_lost"]
    return flags + (["partial"] if any(n.startswith(".") for n in os.listdir(d)) else [])


CONCURRENT = [
    Case("h2m_two_runs_one_output", "convert", h2m(), item="36", needle="another run",
         run=_two_runs, check=_first_run_output, transient=("mg",)),
]


# -- what hf-to-megatron must not drop, cast or accept ---------------------------------------
def _edited_hf(config=None, tensors=None):
    """A copy of the HF fixture with ``config(cfg)`` applied to its ``config.json`` (a return
    value replaces it) and ``tensors(dict)`` to its safetensors (in place)."""
    def hf(fx, d):
        path = _hf_copy(fx, d)
        if config is not None:
            with open(os.path.join(path, "config.json")) as f:
                cfg = json.load(f)
            cfg = config(cfg) or cfg
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(cfg, f)
        if tensors is not None:
            from safetensors.torch import load_file, save_file

            st = os.path.join(path, "model.safetensors")
            weights = load_file(st)
            tensors(weights)
            save_file(weights, st, metadata={"format": "pt"})
        return path
    return hf


def _extra_tensor(w):
    import torch

    w["model.layers.0.self_attn.rotary_emb.extra_scale"] = torch.ones(4)


def _int32_norm(w):
    import torch

    w["model.norm.weight"] = torch.ones_like(w["model.norm.weight"], dtype=torch.int32)


HF_CONTENT = [
    Case("h2m_config_fewer_layers_than_weights", "convert", h2m(hf=_edited_hf(
        config=lambda c: c.update(num_hidden_layers=1))), item="36", needle="model.layers.1."),
    Case("h2m_unknown_extra_tensor", "convert", h2m(hf=_edited_hf(tensors=_extra_tensor)),
         item="36", needle="extra_scale"),
    Case("h2m_rope_theta_negative", "convert", h2m(hf=_edited_hf(
        config=lambda c: c.update(rope_theta=-5))), item="36", needle="rope_theta"),
    Case("h2m_rope_parameters_theta_negative", "convert", h2m(hf=_edited_hf(
        config=lambda c: c["rope_parameters"].update(rope_theta=-5.0))), item="36",
        needle="rope_theta"),
    Case("h2m_rms_norm_eps_nan", "convert", h2m(hf=_edited_hf(
        config=lambda c: c.update(rms_norm_eps=float("nan")))), item="36",
        needle="rms_norm_eps"),
    Case("h2m_int32_norm_weight", "convert", h2m(hf=_edited_hf(tensors=_int32_norm)),
         item="36", needle="model.norm.weight"),
    Case("h2m_config_json_is_a_list", "convert", h2m(hf=_edited_hf(config=lambda c: [c])),
         item="36", needle="config.json"),
]


# -- a full disk inside torch's checkpoint writer ---------------------------------------------
def _torch_writer_enospc(fx, d):
    """``torch.distributed.checkpoint``'s file writer meeting a full disk: Megatron's async
    writer wraps the worker's ``OSError`` as ``RuntimeError("Worker failure: ...")`` and torch
    re-raises it (what a real full disk gives, unlike a patched ``save_release_checkpoint``)."""
    import contextlib

    from sweep import raise_in

    @contextlib.contextmanager
    def patched():
        target = "megatron.core.dist_checkpointing.strategies.filesystem_async"
        with raise_in(target, "FileSystemWriterAsync.write_preloaded_data",
                      OSError(errno.ENOSPC, "No space left on device")):
            yield
    return patched()


FULL_DISK = [
    Case("h2m_full_disk_in_torch_writer", "convert", h2m(), item="36", needle="space",
         patch=_torch_writer_enospc),
]


# -- megatron-to-hf: damaged checkpoint and tokenizer files ---------------------------------
def _mg_damaged(how):
    def build(fx, d):
        ckpt = _mg_copy(fx, d)
        how(os.path.join(ckpt, "release"))
        return ["megatron-to-hf", "--checkpoint", ckpt, "--output", os.path.join(d, "export"),
                "--target-length", "1024", "--no-progress"]
    return build


def _random_bytes(path, n=512):
    with open(path, "wb") as f:
        f.write(os.urandom(n))


def _truncated_tokenizer(fx, d):
    tok = os.path.join(d, "tokenizer.json")
    with open(os.path.join(fx.hf, "tokenizer.json"), "rb") as f:
        data = f.read()
    with open(tok, "wb") as f:
        f.write(data[: len(data) // 2])
    return m2h("--tokenizer", tok)(fx, d)


EXPORT = [
    Case("m2h_iteration_dir_without_metadata", "convert",
         _mg_damaged(lambda r: os.unlink(os.path.join(r, ".metadata"))), item="36",
         needle=".metadata"),
    Case("m2h_metadata_json_random_bytes", "convert",
         _mg_damaged(lambda r: _random_bytes(os.path.join(r, "metadata.json"))), item="36",
         needle="metadata.json"),
    Case("m2h_tokenizer_json_truncated", "convert", _truncated_tokenizer, item="36",
         needle="tokenizer.json"),
]

CASES = [*OVERLAP, *CONCURRENT, *HF_CONTENT, *FULL_DISK, *EXPORT]
