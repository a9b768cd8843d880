"""The sweep's table, part 2: inspect, convert (both directions), eval and the pretrain entry's
start-up (all pretrain cases run in one process through ``pretrain_driver.py``)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys

from sweep import HERE, Case, classify, raise_in, snapshot
from sweep_fixtures import P, SUFFIXES
from tests.support.sidecar_edit import rewrite_header

#: A full disk, as the conversion writers would meet it.
ENOSPC = OSError(errno.ENOSPC, "No space left on device", "/data/out/model.safetensors")


def _safetensors_enospc():
    """What safetensors' Rust writer raises on a full disk (not an ``OSError``)."""
    from safetensors import SafetensorError

    return SafetensorError('Error while serializing: I/O error: No space left on device (os '
                           'error 28)')


def prev(fx, d, name="data") -> str:
    prefix = os.path.join(d, name)
    for s in SUFFIXES:
        shutil.copyfile(fx.good + s, prefix + s)
    return prefix


def damaged(how):
    """Inspect a previous dataset after ``how(prefix)`` damaged it."""
    def build(fx, d):
        prefix = prev(fx, d)
        how(fx, prefix)
        return [prefix, "--no-text"]
    return build


def _truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def copy_tree(src, d, name):
    dst = os.path.join(d, name)
    shutil.copytree(src, dst)
    return dst


def m2h(*extra, ckpt="mg", out=None):
    def build(fx, d):
        output = out(fx, d) if out else os.path.join(d, "export")
        return ["megatron-to-hf", "--checkpoint", getattr(fx, ckpt), "--output", output,
                "--target-length", "1024", "--no-progress", *extra]
    return build


def h2m(*extra, hf=lambda fx, d: fx.hf, out=None):
    def build(fx, d):
        output = out(fx, d) if out else os.path.join(d, "mg")
        return ["hf-to-megatron", "--hf-dir", hf(fx, d), "--output", output, "--no-progress",
                *extra]
    return build


def ev(*extra, hf=lambda fx, d: fx.hf, out=None, tasks="passkey"):
    def build(fx, d):
        output = out(fx, d) if out else os.path.join(d, "res.json")
        return ["--hf-dir", hf(fx, d), "--tasks", tasks, "--lengths", "200", "--samples", "1",
                "--depths", "0.5", "--device", "cpu", "--output", output, "--no-progress",
                *extra]
    return build


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _stale_partial(fx, d):
    stale = os.path.join(d, f".export.partial-{dead_pid()}-abc123")
    os.makedirs(stale)
    with open(os.path.join(stale, "model.safetensors"), "wb") as f:
        f.write(b"\0" * 4096)
    return m2h()(fx, d)


def _no_partial(d):
    return ["partial"] if any(".partial-" in n for n in os.listdir(d)) else []


def _nan_results_kept(fx, d, res):
    path = os.path.join(d, "res.json")
    if not os.path.exists(path):
        return ["data_lost"]
    text = open(path).read()
    return [] if "null" in text and "warning:" in res["stderr"] else ["partial"]


def _ppl_surrogate(fx, d):
    path = os.path.join(d, "ppl.jsonl")
    with open(path, "w") as f:
        f.write('{"text": "fine text here"}\n{"text": "broken \\ud800 pair"}\n')
    return ev("--ppl-data", path, tasks="ppl")(fx, d)


def _hf_truncated(fx, d):
    hf = copy_tree(fx.hf, d, "hf")
    _truncate(os.path.join(hf, "model.safetensors"))
    return hf


def sigterm_subprocess(tool, module, attr, at_call=1):
    """Run the tool in a fresh process (``sigterm_driver.py``) that sends itself SIGTERM at
    the ``at_call``-th call of ``module.attr``: a scheduler's kill while the tool writes.
    Without a handler the process dies of the signal (-15 -> 143), temporaries left."""
    def run(fx, d, argv):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, os.path.join(HERE, "sigterm_driver.py"), tool,
                               module, attr, str(at_call), "--", *argv], env=env,
                              capture_output=True, text=True, timeout=600,
                              cwd=os.path.dirname(d))
        code = proc.returncode
        return (128 - code if code < 0 else code), proc.stderr
    return run


CASES: list[Case] = [
    # inspect
    Case("insp_missing_prefix", "inspect", lambda fx, d: [os.path.join(d, "nope")],
         needle="nope"),
    Case("insp_bin_extension", "inspect", lambda fx, d: [prev(fx, d) + ".bin"]),
    Case("insp_index_out_of_range", "inspect", lambda fx, d: [prev(fx, d), "--index", "99999"],
         needle="--index"),
    Case("insp_index_negative", "inspect", lambda fx, d: [prev(fx, d), "--index", "-1"],
         needle="--index"),
    Case("insp_other_vocab_tokenizer", "inspect", lambda fx, d: [
        prev(fx, d), "--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model",
        fx.spm_small], item="11", needle="vocabulary"),
    Case("insp_sidecar_missing", "inspect",
         damaged(lambda fx, p: os.unlink(p + ".endprompt")), needle=".endprompt"),
    Case("insp_sidecar_truncated", "inspect",
         damaged(lambda fx, p: _truncate(p + ".endprompt", 0.7)), needle=".endprompt"),
    Case("insp_sidecar_of_other_data", "inspect",
         damaged(lambda fx, p: shutil.copyfile(fx.null + ".endprompt", p + ".endprompt")),
         needle=".endprompt"),
    Case("insp_bin_truncated", "inspect", damaged(lambda fx, p: _truncate(p + ".bin")),
         needle=".bin"),
    Case("insp_idx_garbage", "inspect",
         damaged(lambda fx, p: open(p + ".idx", "wb").write(b"garbage" * 10)), needle=".idx"),
    Case("insp_sidecar_weight_inf", "inspect",
         damaged(lambda fx, p: rewrite_header(
             p + ".endprompt", lambda h: h["layout"].update(terminal_loss_weight=float("inf")))),
         item="3", needle=".endprompt"),
    # megatron-to-hf
    Case("m2h_pi_factor_0", "convert", m2h("--pi-factor", "0"), item="5", needle="--pi-factor"),
    Case("m2h_pi_factor_negative", "convert", m2h("--pi-factor", "-2"), needle="--pi-factor"),
    Case("m2h_pi_factor_nan", "convert", m2h("--pi-factor", "nan"), needle="--pi-factor"),
    Case("m2h_pi_factor_inf", "convert", m2h("--pi-factor", "inf"), needle="--pi-factor"),
    Case("m2h_target_length_0", "convert", m2h("--target-length", "0"),
         needle="--target-length"),
    Case("m2h_target_below_window", "convert", m2h("--target-length", "128"),
         needle="--target-length"),
    Case("m2h_checkpoint_missing", "convert",
         lambda fx, d: m2h()(fx, d)[:2] + [os.path.join(d, "nope")] + m2h()(fx, d)[3:],
         needle="nope"),
    Case("m2h_checkpoint_empty_dir", "convert", lambda fx, d: [
        "megatron-to-hf", "--checkpoint", os.makedirs(os.path.join(d, "e")) or
        os.path.join(d, "e"), "--output", os.path.join(d, "export"), "--no-progress"]),
    Case("m2h_output_exists", "convert", m2h(out=lambda fx, d: copy_tree(fx.export, d, "prev")),
         needle="--overwrite"),
    Case("m2h_output_readonly", "convert", m2h(out=lambda fx, d: "/sys/endprompt_export"),
         item="11"),
    Case("m2h_nan_weights", "convert", m2h(ckpt="mg_nan"), item="5", needle="NaN"),
    Case("m2h_nan_over_previous_export", "convert",
         m2h("--overwrite", ckpt="mg_nan", out=lambda fx, d: copy_tree(fx.export, d, "prev")),
         item="5", needle="NaN"),
    Case("m2h_full_disk", "convert", m2h(), item="11", needle="space",
         patch=lambda fx, d: raise_in("megatron_endprompt.conversion.hf_io",
                                      "ShardedSafetensorsWriter.close", ENOSPC)),
    Case("m2h_tokenizer_missing", "convert", m2h("--tokenizer", "/nonexistent/tok"),
         needle="tokenizer"),
    Case("m2h_stale_partial_removed", "convert", _stale_partial, rc=0, item="8",
         check=lambda fx, d, res: _no_partial(d)),
    Case("m2h_sigterm", "convert", m2h(), rc=143, item="8", needle="SIGTERM",
         run=sigterm_subprocess("convert", "megatron_endprompt.conversion.hf_io",
                            "ShardedSafetensorsWriter.close")),
    # hf-to-megatron
    Case("h2m_hf_dir_missing", "convert", h2m(hf=lambda fx, d: os.path.join(d, "nope")),
         needle="nope"),
    Case("h2m_no_safetensors", "convert", h2m(hf=lambda fx, d: _config_only(fx, d))),
    Case("h2m_truncated_safetensors", "convert", h2m(hf=_hf_truncated), item="11"),
    Case("h2m_nan_weights", "convert", h2m(hf=lambda fx, d: fx.hf_nan), item="5", needle="NaN"),
    Case("h2m_vocab_divisor_0", "convert", h2m("--make-vocab-size-divisible-by", "0"),
         item="11", needle="--make-vocab-size-divisible-by"),
    Case("h2m_tp_0", "convert", h2m("--tensor-parallel-size", "0"),
         needle="--tensor-parallel-size"),
    Case("h2m_output_exists", "convert", h2m(out=lambda fx, d: copy_tree(fx.mg, d, "prev")),
         needle="--overwrite"),
    Case("h2m_output_readonly", "convert", h2m(out=lambda fx, d: "/sys/endprompt_mg"),
         item="11"),
    Case("m2h_full_disk_in_safetensors", "convert", m2h(), item="27", needle="space",
         patch=lambda fx, d: raise_in("safetensors.torch", "save_file", _safetensors_enospc())),
    Case("h2m_full_disk", "convert", h2m(), item="11", needle="space",
         patch=lambda fx, d: raise_in("megatron_endprompt.conversion.hf_to_megatron",
                                      "save_release_checkpoint", ENOSPC)),
    Case("h2m_sigterm", "convert", h2m(), rc=143, item="8", needle="SIGTERM",
         run=sigterm_subprocess("convert", "megatron_endprompt.conversion.hf_to_megatron",
                            "save_release_checkpoint")),
    # eval
    Case("ev_hf_dir_missing", "eval", ev(hf=lambda fx, d: os.path.join(d, "nope")),
         needle="--hf-dir"),
    Case("ev_output_readonly", "eval", ev(out=lambda fx, d: "/sys/endprompt_eval/res.json"),
         item="9", needle="--output"),
    Case("ev_output_is_dir", "eval",
         ev(out=lambda fx, d: os.makedirs(os.path.join(d, "r.json")) or
            os.path.join(d, "r.json")), item="9", needle="--output"),
    Case("ev_truncated_safetensors", "eval", ev(hf=_hf_truncated), item="11",
         needle="safetensors"),
    Case("ev_nan_model_results_kept", "eval",
         ev("--ppl-data", "PPL", "--ppl-max-windows", "1", hf=lambda fx, d: fx.hf_nan,
            tasks="passkey,ppl"), rc=0, item="9", check=_nan_results_kept),
    Case("ev_full_disk", "eval", ev(), item="11", needle="space",
         patch=lambda fx, d: raise_in("os", "replace", ENOSPC)),
    Case("ev_lengths_bogus", "eval", ev("--lengths", "abc"), needle="--lengths"),
    Case("ev_lengths_too_short", "eval", ev("--lengths", "10"), needle="--lengths"),
    Case("ev_tasks_bogus", "eval", ev("--tasks", "bogus"), needle="--tasks"),
    Case("ev_ppl_data_missing", "eval", ev("--ppl-data", "/nonexistent.txt", tasks="ppl"),
         needle="--ppl-data"),
    Case("ev_ppl_lone_surrogate", "eval", _ppl_surrogate, item="11", needle="--ppl-data"),
    Case("ev_samples_0", "eval", ev("--samples", "0"), needle="--samples"),
    Case("ev_depth_out_of_range", "eval", ev("--depths", "2"), needle="--depths"),
]


def _config_only(fx, d):
    path = os.path.join(d, "cfg_only")
    os.makedirs(path)
    shutil.copyfile(os.path.join(fx.hf, "config.json"), os.path.join(path, "config.json"))
    return path


# "PPL" placeholder -> the fixture's text file
for _c in CASES:
    if _c.name == "ev_nan_model_results_kept":
        _build = _c.build
        _c.build = (lambda b: lambda fx, d: [fx.ppl if a == "PPL" else a for a in b(fx, d)])(
            _build)


from sweep_pretrain import CASES as _PRETRAIN, run_pretrain_cases  # noqa: E402
from sweep_cases_merge import CASES as _MERGE  # noqa: E402
from sweep_cases_startup import CASES as _STARTUP  # noqa: E402
from sweep_cases_data_tools import CASES as _DATA_TOOLS  # noqa: E402
from sweep_cases_convert import CASES as _CONVERT  # noqa: E402
from sweep_cases_pretrain_outputs import CASES as _PRETRAIN_OUTPUTS  # noqa: E402

CASES += _PRETRAIN + _MERGE + _STARTUP + _DATA_TOOLS + _CONVERT + _PRETRAIN_OUTPUTS
__all__ = ["CASES", "run_pretrain_cases", "HERE", "classify", "snapshot", "P", "sys"]
