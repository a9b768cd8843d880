"""examples/slurm/pretrain_llama3_endprompt.sbatch without SLURM: a fake ``SLURM_*`` environment
and stub ``srun`` / ``scontrol`` / ``torchrun`` on ``PATH``. The script must start one task per
node whose torchrun command has that node's rank, the first node as master, the restart-safe
``--load OUT --pretrained-checkpoint IN`` pair and the SIGUSR1 save-and-exit handler; a SIGUSR1
from SLURM must reach the srun step and requeue the job."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time

from launch_fixtures import launch_env, write_prefix

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(REPO, "examples", "slurm", "pretrain_llama3_endprompt.sbatch")

SRUN = r"""#!/usr/bin/env bash
# stub srun: record the options, run the command once per node with SLURM_NODEID set
opts=()
while [[ "$1" == --* ]]; do opts+=("$1"); shift; done
printf '%s\n' "${opts[@]}" > "$STUB_DIR/srun.args"
if [ -n "${STUB_SRUN_BLOCK:-}" ]; then
  trap 'echo USR1 > "$STUB_DIR/srun.signal"; exit 0' USR1
  trap 'echo TERM > "$STUB_DIR/srun.signal"; exit 143' TERM
  touch "$STUB_DIR/srun.ready"
  while :; do sleep 0.1; done
fi
for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do
  SLURM_NODEID=$n SLURM_PROCID=$n SLURM_LOCALID=0 "$@" || exit $?
done
"""
SCONTROL = r"""#!/usr/bin/env bash
case "$1 $2" in
  "show hostnames") printf 'gpu-node001\ngpu-node002\n' ;;
  *) echo "$*" >> "$STUB_DIR/scontrol.log" ;;
esac
"""
TORCHRUN = r"""#!/usr/bin/env bash
out="$STUB_DIR/torchrun.$SLURM_NODEID"
printf '%s\n' "$@" > "$out"
echo "ENV PET_SIGNALS_TO_HANDLE=$PET_SIGNALS_TO_HANDLE" >> "$out"
"""


def _env(tmp_path, **extra):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("torchrun", TORCHRUN)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    # a clean environment: nothing of the test process (MASTER_PORT, NODE_RANK...) leaks in
    paths = launch_env(tmp_path)  # real files: the launch script checks them before torchrun
    paths.pop("DATA_PREFIX")
    paths.pop("PATH")
    write_prefix(str(tmp_path / "replay"), 5000)
    return dict(**paths, STUB_DIR=str(tmp_path),
                SLURM_JOB_ID="4242", SLURM_JOB_NAME="ep", SLURM_JOB_NODELIST="gpu-node[001-002]",
                SLURM_JOB_NUM_NODES="2", SLURM_NNODES="2", SLURM_GPUS_ON_NODE="8",
                SLURM_SUBMIT_DIR=REPO, LOG_DIR=str(tmp_path / "logs"),
                DATA_BLEND=f"0.8 {tmp_path}/ep 0.2 {tmp_path}/replay",
                **{**extra, "PATH": f"{bin_dir}:{os.environ['PATH']}"})


def test_sbatch_header():
    header = [line.split()[1] for line in open(SBATCH) if line.startswith("#SBATCH")]
    assert "--requeue" in header and "--ntasks-per-node=1" in header
    assert any(h.startswith("--signal=B:USR1@") for h in header)
    assert any(h.startswith("--output=") and "%j" in h for h in header)
    assert "--open-mode=append" in header


def test_one_task_per_node_with_its_rank(tmp_path):
    env = _env(tmp_path)
    # extra flags: each node's launcher checks them with Megatron's parser (an import)
    proc = subprocess.run(["bash", SBATCH, "--seed", "7"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    srun = (tmp_path / "srun.args").read_text().split()
    assert "--nodes=2" in srun and "--ntasks-per-node=1" in srun
    assert any(a.startswith("--output=") and "node%n" in a for a in srun)
    assert (tmp_path / "logs").is_dir()
    for node in (0, 1):
        argv = (tmp_path / f"torchrun.{node}").read_text().splitlines()
        assert argv[:10] == ["--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "8",
                             "--master_addr", "gpu-node001", "--master_port", str(20000 + 4242)]
        flags = " ".join(argv)
        out, base = env["CHECKPOINT_OUT"], env["CHECKPOINT_IN"]
        assert f"--load {out} --pretrained-checkpoint {base} --save {out}" in flags
        assert "--finetune" not in flags
        assert "--exit-signal-handler --exit-signal SIGUSR1" in flags
        assert f"--data-path 0.8 {tmp_path}/ep 0.2 {tmp_path}/replay" in flags
        assert argv[-3:] == ["--seed", "7", "ENV PET_SIGNALS_TO_HANDLE="
                             "SIGTERM,SIGINT,SIGHUP,SIGQUIT"]  # USR1: the script's
    assert not (tmp_path / "scontrol.log").exists()  # finished normally: no requeue


def _signal_running_srun(tmp_path, sig: int) -> tuple[int, str, str]:
    """Run the batch script with a blocking srun stub, send ``sig`` to the batch shell once srun
    runs, and wait: ``(exit code, stdout, stderr)``."""
    proc = subprocess.Popen(["bash", SBATCH], env=_env(tmp_path, STUB_SRUN_BLOCK="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "srun.ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_usr1_reaches_srun_and_requeues(tmp_path):
    rc, out, err = _signal_running_srun(tmp_path, signal.SIGUSR1)
    assert rc == 0, err
    assert (tmp_path / "srun.signal").read_text().strip() == "USR1"
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    assert "requeueing job 4242" in out


def test_term_reaches_srun_without_requeue(tmp_path):
    """scancel / the time limit's end send SIGTERM to the batch shell: it must reach srun."""
    rc, _, err = _signal_running_srun(tmp_path, signal.SIGTERM)
    assert (tmp_path / "srun.signal").read_text().strip() == "TERM"
    assert rc == 143, err
    assert not (tmp_path / "scontrol.log").exists()
