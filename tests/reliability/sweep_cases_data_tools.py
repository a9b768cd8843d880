"""The sweep's table for the data tools (preprocess, build_sidecar, inspect): an input that is
also an output, a target name that is a directory, a tokenizer that cannot have written the
corpus, a flag that would be ignored, an unchecked ``.bin``, JSON nested past Python's
recursion limit, and what a full disk leaves behind."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil

from sweep import Case, raise_in
from sweep_fixtures import SUFFIXES, B, L, P, bin_on_full_disk, preprocess_argv

#: What a full disk raises at a write (``write``/``pwrite`` name no file).
NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


def _copy(src: str, dst: str, suffixes=SUFFIXES) -> str:
    for s in suffixes:
        shutil.copyfile(src + s, dst + s)
    return dst


def _sidecar_argv(prefix, *extra):
    return ["--data-prefix", prefix, "--seq-length", str(P), "--target-length", str(L),
            "--terminal-length", str(B), "--no-progress", *extra]


# -- an input that is also an output ---------------------------------------------------------
def _input_named(suffix: str, *extra: str, link: bool = False):
    """The JSONL corpus saved as ``d/x<suffix>`` (``x.bin`` is just a name the user chose),
    then preprocessed to ``--output-prefix d/x``: a file the run writes (or, ``link``, reached
    through a symlink ``d/in.jsonl``)."""
    def build(fx, d):
        target = os.path.join(d, "x" + suffix)
        shutil.copyfile(fx.corpus, target)
        given = target
        if link:
            given = os.path.join(d, "in.jsonl")
            os.symlink(target, given)
        return preprocess_argv(os.path.join(d, "x"), given, fx.spm, *extra)
    return build


def _lock_is_link(hard: bool):
    """``PREFIX.lock`` is a link to the corpus's ``.bin`` (the lock is truncated in place)."""
    def build(fx, d):
        prefix = _copy(fx.good, os.path.join(d, "data"), (".bin", ".idx"))
        (os.link if hard else os.symlink)(prefix + ".bin", prefix + ".lock")
        return _sidecar_argv(prefix)
    return build


# -- a target name that is a directory -------------------------------------------------------
def _target_is_dir(suffix: str, *extra: str):
    def build(fx, d):
        os.makedirs(os.path.join(d, "data" + suffix))
        return preprocess_argv(os.path.join(d, "data"), fx.small_corpus, fx.spm, *extra)
    return build


def _sc_target_is_dir(fx, d):
    prefix = _copy(fx.good, os.path.join(d, "data"), (".bin", ".idx"))
    os.makedirs(prefix + ".endprompt")
    return _sidecar_argv(prefix)


# -- a tokenizer that cannot have written the corpus -----------------------------------------
def _sc_small_vocab(source: str):
    def build(fx, d):
        prefix = _copy(fx.good, os.path.join(d, "data"), (".bin", ".idx"))
        return _sidecar_argv(prefix, "--terminal-source", source, "--tokenizer-type",
                             "GPTSentencePieceTokenizer", "--tokenizer-model", fx.spm_small)
    return build


# -- a flag that would be ignored ------------------------------------------------------------
def _pp_prompts_without_source(fx, d):
    prefix = _copy(fx.good, os.path.join(d, "data"))
    return preprocess_argv(prefix, fx.small_corpus, fx.spm, "--terminal-prompts", "ep1-3")


def _sc_prompts_without_source(fx, d):
    prefix = _copy(fx.good, os.path.join(d, "data"), (".bin", ".idx"))
    return _sidecar_argv(prefix, "--terminal-prompts", "ep1-3")


# -- a .bin that changed after its sidecar was written ---------------------------------------
def _bit_flipped(fx, d):
    prefix = _copy(fx.good, os.path.join(d, "data"))
    with open(prefix + ".bin", "r+b") as f:
        f.seek(10)
        byte = f.read(1)[0]
        f.seek(10)
        f.write(bytes([byte ^ 0x04]))
    return [prefix, "--no-text"]


# -- JSON nested past the recursion limit ----------------------------------------------------
def _nested(key: str, *extra: str):
    """A good line, then one whose ``key`` holds 200,000 nested arrays."""
    def build(fx, d):
        prefix = _copy(fx.good, os.path.join(d, "data"))
        path = os.path.join(d, "in.jsonl")
        deep = "[" * 200_000 + "]" * 200_000
        with open(fx.corpus, "rb") as src, open(path, "wb") as f:
            f.write(src.readline())
            body = f'"{key}": {deep}' if key != "text" else f'"text": {deep}'
            extra_text = ', "text": "x"' if key != "text" else ""
            f.write(("{" + body + extra_text + "}\n").encode())
            f.write(src.read())
        return preprocess_argv(prefix, path, fx.spm, *extra)
    return build


# -- a full disk -----------------------------------------------------------------------------


class _DiskWithRoom(io.FileIO):
    """A file on a disk with ``room`` bytes free: writes past it fail with ENOSPC (after a
    short write, as the kernel does), so the buffered writer's ``close()`` fails again."""

    def __init__(self, path, mode, room):
        super().__init__(path, mode)
        self.room = room

    def write(self, b):
        view = memoryview(b).cast("B")
        if self.room == 0 and len(view):
            raise OSError(errno.ENOSPC, "No space left on device")
        view = view[: self.room]
        self.room -= len(view)
        return super().write(view)


@contextlib.contextmanager
def _bin_fills_disk(room=4096):
    """The ``.bin`` temporary is a real file that fills the disk after ``room`` bytes."""
    import builtins

    from megatron_endprompt.data.sidecar import indexed_io

    def fake_open(path, mode="r", *args, **kwargs):
        if ".bin.tmp-" in str(path) and "w" in mode:
            return io.BufferedWriter(_DiskWithRoom(path, "wb", room))
        return builtins.open(path, mode, *args, **kwargs)

    indexed_io.open = fake_open  # the module's own name shadows the builtin
    try:
        yield
    finally:
        del indexed_io.open


def _sc_full_disk(fx, d):
    return _sidecar_argv(_copy(fx.good, os.path.join(d, "data"), (".bin", ".idx")))


CASES: list[Case] = [
    Case("pp_input_is_output_bin", "preprocess", _input_named(".bin"), needle="--input"),
    Case("pp_input_is_output_idx", "preprocess", _input_named(".idx"), needle="--input"),
    Case("pp_input_is_output_sidecar_via_symlink", "preprocess",
         _input_named(".endprompt", link=True), needle="--input"),
    Case("pp_input_is_named_sidecar", "preprocess", _input_named(".v2.endprompt", "--name", "v2"),
         needle="--input"),
    Case("pp_input_is_lock", "preprocess", _input_named(".lock"), needle="--input"),
    Case("sc_lock_is_symlink_to_bin", "sidecar", _lock_is_link(False), needle="data.lock"),
    Case("sc_lock_is_hard_link_to_bin", "sidecar", _lock_is_link(True), needle="data.lock"),
    Case("pp_idx_is_directory", "preprocess", _target_is_dir(".idx"), needle="data.idx"),
    Case("pp_sidecar_is_directory", "preprocess", _target_is_dir(".endprompt"),
         needle="data.endprompt"),
    Case("pp_bin_is_directory", "preprocess", _target_is_dir(".bin"), needle="data.bin"),
    Case("pp_named_sidecar_is_directory", "preprocess",
         _target_is_dir(".v2.endprompt", "--name", "v2"), needle="data.v2.endprompt"),
    Case("sc_sidecar_is_directory", "sidecar", _sc_target_is_dir, needle="data.endprompt"),
    Case("sc_small_vocab_continuation", "sidecar", _sc_small_vocab("continuation"),
         needle="--tokenizer-model"),
    Case("sc_small_vocab_document_tail", "sidecar", _sc_small_vocab("document-tail"),
         needle="--tokenizer-model"),
    Case("pp_prompts_without_prompt_source", "preprocess", _pp_prompts_without_source,
         needle="--terminal-prompts"),
    Case("sc_prompts_without_prompt_source", "sidecar", _sc_prompts_without_source,
         needle="--terminal-prompts"),
    Case("in_bin_bit_flipped", "inspect", _bit_flipped, needle="CRC"),
    Case("pp_nested_json_text", "preprocess", _nested("text"), needle="in.jsonl:2"),
    Case("pp_nested_json_unused_field", "preprocess", _nested("meta"), needle="in.jsonl:2"),
    Case("pp_nested_json_two_workers", "preprocess", _nested("meta", "--workers", "2"),
         needle="in.jsonl:2"),
    Case("pp_full_disk_names_file", "preprocess",
         lambda fx, d: preprocess_argv(_copy(fx.good, os.path.join(d, "data")),
                                       fx.small_corpus, fx.spm),
         patch=lambda fx, d: bin_on_full_disk(os.path.join(d, "data")), needle="data.bin"),
    Case("pp_full_disk_leaves_nothing", "preprocess",
         lambda fx, d: preprocess_argv(_copy(fx.good, os.path.join(d, "data")),
                                       fx.small_corpus, fx.spm),
         patch=lambda fx, d: _bin_fills_disk(), needle="data.bin"),
    Case("sc_full_disk_at_lock", "sidecar", _sc_full_disk, needle="data.lock",
         patch=lambda fx, d: raise_in("os", "pwrite", NO_SPACE)),
]
