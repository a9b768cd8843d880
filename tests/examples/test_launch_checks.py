"""examples/pretrain_llama3_endprompt.sh start-up checks (megatron_endprompt.training.launch_check):
``--dry-run`` and a real launch refuse bad values, missing paths/sidecars and a split that leaves a
split of the corpus empty with one ``error:`` line and exit 2, before torchrun; a valid setup
prints the torchrun command. Paths are real files (a minimal Megatron ``.idx`` header and a
sidecar file name) so the path checks run."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys

import pytest
from launch_fixtures import launch_env, write_prefix

from launch_fixtures import REPO  # noqa: E402

SCRIPT = os.path.join(REPO, "examples", "pretrain_llama3_endprompt.sh")


_prefix = write_prefix


@pytest.fixture
def setup(tmp_path):
    return tmp_path, launch_env(tmp_path)


def _run(env, *args):
    return subprocess.run(["bash", SCRIPT, "--dry-run", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _refused(env, **over):
    proc = _run({**env, **over})
    assert proc.returncode == 2, (over, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (over, proc.stderr)
    assert proc.stdout == ""
    return lines[0]


def test_valid_setup_prints_the_command(setup):
    tmp, env = setup
    proc = _run({**env, "SPLIT": "90,5,5", "SEED": "7"})
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert "torchrun" in words
    assert words[words.index("--split") + 1] == "90,5,5"
    assert words[words.index("--seed") + 1] == "7"
    assert words[words.index("--endprompt-pi-factor") + 1] == "8"  # ceil(65536 / 8192)
    # no Transformer Engine here: TP=4 must not force --sequence-parallel
    te = subprocess.run([sys.executable, "-c", "import transformer_engine"],
                        capture_output=True).returncode == 0
    assert ("--sequence-parallel" in words) == te
    forced = shlex.split(_run({**env, "SEQUENCE_PARALLEL": "1"}).stdout)
    assert "--sequence-parallel" in forced


@pytest.mark.parametrize("over, says", [
    ({"TP": "x"}, "TP='x' is not an integer"),
    ({"TP": "abc"}, "TP='abc' is not an integer"),
    ({"TP": "0"}, "TP=0 must be >= 1"),
    ({"TP": "3"}, "TP=3"),
    ({"TARGET_LENGTH": "131072", "PI_FACTOR": "8"}, "PI_FACTOR=16"),
    ({"SEQ_LENGTH": "131072"}, "larger than seq length"),
    ({"NODE_RANK": "4", "NNODES": "4"}, "NODE_RANK=4 must be below NNODES=4"),
    ({"GLOBAL_BATCH": "101"}, "GLOBAL_BATCH=101"),
    ({"SPLIT": "a,b"}, "SPLIT="),
    ({"SEQUENCE_PARALLEL": "yes"}, "SEQUENCE_PARALLEL="),
])
def test_bad_values_are_one_line(setup, over, says):
    _, env = setup
    assert says in _refused(env, **over)


def test_target_length_equal_to_the_original_window_launches_at_s_1(setup):
    """``TARGET_LENGTH = ORIGINAL_LENGTH`` (fine-tuning at the model's own window) passes the
    checks, with ``s = 1``."""
    tmp, env = setup
    prefix = _prefix(str(tmp / "s1"), 5000, seq_length=4096, target_length=8192)
    proc = _run({**env, "SEQ_LENGTH": "4096", "TARGET_LENGTH": "8192",
                 "ORIGINAL_LENGTH": "8192", "DATA_PREFIX": prefix})
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[words.index("--endprompt-pi-factor") + 1] == "1"
    assert words[words.index("--endprompt-target-length") + 1] == "8192"


def test_target_length_below_the_original_window_is_one_line(setup):
    _, env = setup
    line = _refused(env, SEQ_LENGTH="2048", TARGET_LENGTH="4096", ORIGINAL_LENGTH="8192")
    assert "L=4096 (TARGET_LENGTH) is below the original context window 8192" in line
    assert "raise TARGET_LENGTH to 8192" in line


def test_blend_problems_are_one_line(setup):
    tmp, env = setup
    a = env.pop("DATA_PREFIX")
    b = _prefix(str(tmp / "replay"), 5000, sidecar=None)
    assert "3 values" in _refused(env, DATA_BLEND=f"0.8 {a} 0.2")
    assert "glob" in _refused(env, DATA_BLEND=f"0.5 {tmp}/e* 0.5 {b}")
    assert "not a prefix of DATA_BLEND" in _refused(
        env, DATA_BLEND=f"0.5 {a} 0.5 {b}", REPLAY_PREFIXES=str(tmp / "other"))
    # b has no sidecar: refused unless it is replay data
    assert "no sidecar" in _refused(env, DATA_BLEND=f"0.5 {a} 0.5 {b}")
    ok = _run({**env, "DATA_BLEND": f"0.5 {a} 0.5 {b}", "REPLAY_PREFIXES": b})
    assert ok.returncode == 0, ok.stderr


def test_missing_paths_and_sidecars_are_one_line(setup):
    tmp, env = setup
    assert "TOKENIZER=" in _refused(env, TOKENIZER=str(tmp / "nope"))
    assert "CHECKPOINT_IN=" in _refused(env, CHECKPOINT_IN=str(tmp / "nope"))
    assert ".bin not found" in _refused(env, DATA_PREFIX=str(tmp / "nope"))
    _prefix(str(tmp / "named"), 5000, sidecar="L64K")
    line = _refused(env, DATA_PREFIX=str(tmp / "named"), SIDECAR_NAME="L46K")
    assert "named.L64K.endprompt" in line  # the sidecars that exist are listed
    ok = _run({**env, "DATA_PREFIX": str(tmp / "named"), "SIDECAR_NAME": "L64K"})
    assert ok.returncode == 0, ok.stderr
    assert "--endprompt-sidecar-name L64K" in ok.stdout



def test_megatron_text_document_naming_is_accepted_with_one_line(setup):
    """``preprocess_data.py --output-prefix mg`` writes mg_text_document.bin/.idx: DATA_PREFIX=mg
    is accepted and one line says which files are used; so is ours_text_document for ours."""
    tmp, env = setup
    _prefix(str(tmp / "mg_text_document"), 5000)
    _prefix(str(tmp / "ours"), 5000)
    for given, used in (("mg", "mg_text_document"), ("ours_text_document", "ours")):
        proc = _run({**env, "DATA_PREFIX": str(tmp / given)})
        assert proc.returncode == 0, proc.stderr
        notes = [n for n in proc.stderr.strip().splitlines()
                 if not n.startswith("note: --transformer-impl")]
        assert len(notes) == 1 and notes[0].startswith(f"note: {tmp / given}: ")
        assert f"using {tmp / used}.bin/.idx" in notes[0]


def test_split_leaving_a_split_empty_is_refused(setup):
    tmp, env = setup
    small = _prefix(str(tmp / "small"), 20)
    line = _refused(env, DATA_PREFIX=small)  # 998,1,1 of 20 documents: valid gets 0
    assert "SPLIT=998,1,1 leaves the valid split" in line and "90,5,5" in line
    assert _run({**env, "DATA_PREFIX": small, "SPLIT": "90,5,5"}).returncode == 0


def test_real_launch_checks_before_torchrun(setup):
    """Without --dry-run the same checks run, and torchrun is never started on a problem."""
    tmp, env = setup
    fake = tmp / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text(f"#!/usr/bin/env bash\ntouch {tmp}/started\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {**env, "PATH": f"{fake.parent}:{env['PATH']}"}
    proc = subprocess.run(["bash", SCRIPT], env={**env, "TP": "abc"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: TP='abc'")
    assert not (tmp / "started").exists()
    proc = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (tmp / "started").exists()


def _fake_torchrun(tmp, env):
    fake = tmp / "bin" / "torchrun"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!/usr/bin/env bash\ntouch {tmp}/started\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {**env, "PATH": f"{fake.parent}:{env['PATH']}"}


@pytest.mark.parametrize("args, over, says", [
    (["--dryrun"], {}, "unknown option --dryrun"),  # a typo of --dry-run: no real launch
    (["--train-iters", "5", "--no-such-megatron-flag=1"], {}, "--no-such-megatron-flag"),
    ([], {"EXIT_SIGNAL": "SIGKILL"}, "EXIT_SIGNAL=SIGKILL cannot be caught"),
    ([], {"EXIT_SIGNAL": "STOP"}, "EXIT_SIGNAL=SIGSTOP cannot be caught"),
    ([], {"MASTER_PORT": "99999"}, "MASTER_PORT=99999"),
    ([], {"MASTER_PORT": "0"}, "MASTER_PORT=0"),
])
def test_real_launch_refuses_unknown_options_signals_ports(setup, args, over, says):
    """A real launch (no --dry-run): refused with one line before torchrun starts."""
    tmp, env = setup
    env = _fake_torchrun(tmp, {**env, **over})
    proc = subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        proc.stderr
    assert says in lines[0]
    assert not (tmp / "started").exists()


def test_known_extra_flags_still_launch(setup):
    tmp, env = setup
    env = _fake_torchrun(tmp, env)
    # 50 iterations: more than the 20 warm-up ones (fewer are refused: tests/examples/
    # test_launch_warmup.py)
    proc = subprocess.run(["bash", SCRIPT, "--train-iters", "50", "--endprompt-sidecar-name=x",
                           "--no-load-optim"], env={**env, "EXIT_SIGNAL": "SIGUSR1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp / "started").exists()
