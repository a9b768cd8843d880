"""A torchrun worker that stops as Megatron's ``--exit-signal-handler`` does: Megatron's own
``DistributedSignalHandler`` on ``--exit-signal``, the all-gather of "signal received" at each
iteration boundary, then a "save" (a file per rank, written after the all-gather, as
``save_checkpoint`` runs on every rank) and exit 0. Run by tests/examples/test_clean_stop.py."""

import os
import signal
import sys
import time

import torch.distributed as dist
from megatron.training.dist_signal_handler import DistributedSignalHandler


def main() -> None:
    sig = signal.Signals[sys.argv[sys.argv.index("--exit-signal") + 1]]
    out = os.environ["STOP_DIR"]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with DistributedSignalHandler(sig) as handler:
        with open(os.path.join(out, f"ready.{rank}"), "w") as f:
            f.write(str(os.getpid()))
        for iteration in range(1, 100000):
            time.sleep(0.05)  # one "iteration"
            if any(handler.signals_received()):
                with open(os.path.join(out, f"saved.{rank}"), "w") as f:
                    f.write(str(iteration))
                print("exiting program after receiving SIGTERM.", flush=True)  # Megatron's line
                dist.barrier()
                dist.destroy_process_group()
                sys.exit(0)
    sys.exit(3)  # never stopped


if __name__ == "__main__":
    main()
