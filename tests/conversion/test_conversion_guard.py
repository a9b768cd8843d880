"""``convert_checkpoint.py`` refusing what it must not write: a tokenizer with more ids than the
model's embedding, a RoPE factor the launcher refuses, an ``--output`` that names no directory of
its own, and a full disk inside Megatron's checkpoint writer. Each: one ``error:`` line, exit 2,
nothing written (no hidden ``.partial`` sibling, no lock), every input byte-identical."""

from __future__ import annotations

import errno
import os
import subprocess
from types import SimpleNamespace

import pytest
from conversion_helpers import make_hf_model

from megatron_endprompt.cli.convert import main
from megatron_endprompt.conversion.megatron_to_hf import resolve_window
from megatron_endprompt.errors import UserError
from tests.support.refusal import assert_refused

#: Megatron's asynchronous file-system writer: its worker calls ``_write_item`` per tensor.
WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async"


def _wordlevel_tokenizer(path, pieces: int) -> str:
    """A ``tokenizer.json`` with ``pieces`` ids (``t0`` .. ``t{pieces-1}``)."""
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(pieces)},
                               unk_token="t0")).save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """A tiny HF Llama with a 512-id vocabulary and its ``hf-to-megatron`` conversion (TP=1:
    exactly 512 embedding rows); ``(hf_dir, megatron_dir)``."""
    from megatron_endprompt.conversion import HFToMegatronOptions, convert_hf_to_megatron

    root = tmp_path_factory.mktemp("vocab512")
    hf = make_hf_model(str(root / "hf"), vocab_size=512)
    mg = str(root / "mg")
    convert_hf_to_megatron(HFToMegatronOptions(hf_dir=hf, output=mg, progress=False))
    return hf, mg


# -- a tokenizer with more ids than the model ----------------------------------------------------
def test_tokenizer_larger_than_the_embedding(run_tool, small_vocab, tmp_path):
    """1,000 pieces on a 512-row embedding. The vocabulary comes from the HF config the
    conversion recorded, so the only check (vocabulary vs rows) never saw the tokenizer."""
    _, mg = small_vocab
    tok = _wordlevel_tokenizer(tmp_path / "tokenizer.json", 1000)
    out = tmp_path / "export"
    assert_refused(run_tool, main, ["megatron-to-hf", "--checkpoint", mg, "--output", out,
                                    "--tokenizer", tok, "--no-progress"],
                   f"--tokenizer {tok}: 1000 ids", "vocabulary 512", watch=[tmp_path, mg])


def test_tokenizer_larger_than_the_vocabulary_within_padding(run_tool, converted, tmp_path):
    """1,010 ids on a 1,000-id model whose embedding is padded to 1,024 rows: the ids fit the
    rows, but the exported embedding is cut to the vocabulary."""
    tok = _wordlevel_tokenizer(tmp_path / "tokenizer.json", 1010)
    out = tmp_path / "export"
    assert_refused(run_tool, main, ["megatron-to-hf", "--checkpoint", converted, "--output",
                                    out, "--tokenizer", tok, "--no-progress"],
                   "1010 ids", "vocabulary 1000", watch=[tmp_path, converted])


# -- a RoPE factor the launcher refuses ----------------------------------------------------------
@pytest.mark.parametrize("pi_factor", ["1", "2"])
def test_pi_factor_below_target_over_window(run_tool, converted, tmp_path, pi_factor):
    """L / L0 = 512 / 64 = 8: positions divided by s = 1 or 2 reach past L0."""
    out = tmp_path / "export"
    assert_refused(run_tool, main, ["megatron-to-hf", "--checkpoint", converted, "--output",
                                    out, "--target-length", "512", "--pi-factor", pi_factor,
                                    "--no-progress"],
                   f"--pi-factor {pi_factor} with --target-length 512", "--pi-factor 8",
                   watch=[tmp_path, converted])


def test_run_own_window_is_kept_and_a_new_length_is_checked():
    """The run's own ``(L, s)`` is how the model was trained (the trainer honours Megatron's
    interpolation factor below ``L / L0``); a new ``L`` with it is held to the launcher's rule,
    naming where ``s`` came from."""
    run = SimpleNamespace(endprompt_target_length=512, endprompt_pi_factor=4.0,
                          endprompt_original_length=64)
    assert resolve_window(run, 64, None, None) == (512, 4.0, 64)
    assert resolve_window(run, 64, 256, None) == (256, 4.0, 64)
    with pytest.raises(UserError, match=r"the run's s=4 with --target-length 1024: .* "
                                        r"--pi-factor 16"):
        resolve_window(run, 64, 1024, None)
    assert resolve_window(run, 64, 1024, 16.0) == (1024, 16.0, 64)
    # YaRN does not divide positions; its export is held to s = L / L0 by its own check
    yarn = SimpleNamespace(endprompt_original_length=64, endprompt_rope_scaling="yarn")
    assert resolve_window(yarn, 64, 1024, 4.0) == (1024, 4.0, 64)


# -- an --output that names no directory of its own -----------------------------------------------
@pytest.mark.parametrize("name", ["", ".", "./"])
@pytest.mark.parametrize("direction", ["megatron-to-hf", "hf-to-megatron"])
def test_output_naming_no_directory(run_tool, tiny_hf, converted, tmp_path, monkeypatch, name,
                                    direction):
    """``''`` and ``.`` (with --overwrite too): one line; no hidden ``.partial`` export beside
    the current directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    source = ["--checkpoint", converted] if direction == "megatron-to-hf" else \
        ["--hf-dir", tiny_hf]
    for extra in ([], ["--overwrite"]):
        assert_refused(run_tool, main, [direction, *source, "--output", name, "--no-progress",
                                        *extra],
                       f"--output {name!r} names no new directory", watch=[tmp_path])


# -- a full disk inside Megatron's checkpoint writer --------------------------------------------
def _h2m(hf, out):
    return ["hf-to-megatron", "--hf-dir", hf, "--output", out, "--no-progress"]


def _failing_write(exc):
    def write_item(*args, **kwargs):
        raise exc
    return write_item


def test_full_disk_in_the_writer_worker(run_tool, tiny_hf, tmp_path, monkeypatch):
    """The write fails inside Megatron's worker, which returns the ``OSError`` instead of
    raising it; the caller's ``RuntimeError`` keeps only ``<class 'OSError'>``. The errno is
    read from the worker's logged line."""
    import importlib

    monkeypatch.setattr(importlib.import_module(WRITER), "_write_item",
                        _failing_write(OSError(errno.ENOSPC, "No space left on device")))
    assert_refused(run_tool, main, _h2m(tiny_hf, tmp_path / "out"),
                   "No space left on device", "free disk space", watch=[tmp_path, tiny_hf])


def test_short_write_on_a_full_disk(run_tool, tiny_hf, tmp_path, monkeypatch):
    """torch's zip writer meeting a full disk raises no ``OSError`` at all (``unexpected pos``:
    a short write); the output's file system, still full, says what happened."""
    import importlib

    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(importlib.import_module(WRITER), "_write_item", _failing_write(short))
    from megatron_endprompt.conversion import writer_failure

    monkeypatch.setattr(writer_failure, "_free_bytes", lambda directory: 4096)
    assert_refused(run_tool, main, _h2m(tiny_hf, tmp_path / "out"),
                   "No space left on device", watch=[tmp_path, tiny_hf])


def test_short_write_with_free_space_is_not_called_a_full_disk(run_tool, tiny_hf, tmp_path,
                                                               monkeypatch):
    """The same failure with space left is not guessed at: the writer's error propagates,
    carrying its logged lines, and no partial output is left."""
    import importlib

    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(importlib.import_module(WRITER), "_write_item", _failing_write(short))
    from megatron_endprompt.conversion import writer_failure

    monkeypatch.setattr(writer_failure, "_free_bytes", lambda directory: 1 << 40)
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as info:
        run_tool(main, _h2m(tiny_hf, tmp_path / "out"))
    assert any("unexpected pos 704" in note for note in getattr(info.value, "__notes__", []))
    assert os.listdir(tmp_path) == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 600 KiB tmpfs (smaller than the tiny model's checkpoint), or a skip where mounting
    is not allowed (not root, no CAP_SYS_ADMIN)."""
    mnt = tmp_path / "tiny_fs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("size", ["16k", "600k"])
def test_real_full_disk(run_tool, tiny_hf, tiny_tmpfs, size):
    """A real full file system: at 16 KiB the worker's ``open``/``write`` fails with ENOSPC,
    at 600 KiB torch's zip writer comes up short; one line either way, nothing left."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(tiny_tmpfs)], check=True)
    assert_refused(run_tool, main, _h2m(tiny_hf, tiny_tmpfs / "out"),
                   "No space left on device", watch=[tiny_tmpfs, tiny_hf])
