"""The launch script's console filter (megatron_endprompt.training.launch_console), fed the
kinds of lines torchrun tees from its ranks: what reaches the console, what only the log."""

from __future__ import annotations

import io

from megatron_endprompt.training.launch_console import LaunchConsole, run_console

ITER = (" [2026-12-07 03:22:34.925727] iteration        1/       4 | consumed samples:"
        "            2 | lm loss: 6.921134E+00 |")
FAILED = ("E1207 03:33:06.726000 3206 /x/torch/distributed/elastic/multiprocessing/api.py:1002]"
          " failed (exitcode: 2) local_rank: 0 (pid: 3500) of binary: /x/python")


def _run(lines: list[str]) -> tuple[list[str], str, int]:
    console, log = io.StringIO(), io.StringIO()
    sorter = LaunchConsole(console=console, log=log)
    for line in lines:
        sorter.feed(line + "\n")
    sorter.finish()
    return console.getvalue().splitlines(), log.getvalue(), 3 if sorter.refused else 0


def test_argument_table_and_warnings_go_to_the_log_only():
    lines = ["[rank0]: ------------------------ arguments ------------------------",
             "[rank0]:   micro_batch_size ................................ 1",
             "[rank0]: -------------------- end of arguments ---------------------",
             "[rank1]: /x/megatron/core/optimizer/__init__.py:25: UserWarning: Apex is not "
             "installed.",
             "[rank1]:   warnings.warn(",
             "[rank0]: /x/argument_utils.py:543: UserWarning: ",
             "[rank0]:         It is recommended to use a ModelConfig",
             "[rank0]:         ",
             "[rank0]:   warnings.warn(msg)",
             "W1207 03:08:03.229000 7160 /x/torch/utils/cpp_extension.py:183] No CUDA runtime",
             "[rank0]: INFO:megatron.core.timers:(min, max) time across ranks (ms):",
             "[rank0]:     load-checkpoint ................................: (84.75, 84.96)",
             "[rank1]: EndPrompt: L=512 L0=64 s=8",
             "[rank0]: EndPrompt: L=512 L0=64 s=8",  # every rank: shown once
             f"[rank1]: {ITER}",
             "[rank1]: [Rank 1] (after 1 iterations) memory (MB) | allocated: 0.00"]
    console, log, rc = _run(lines)
    assert console == ["EndPrompt: L=512 L0=64 s=8", ITER]
    assert log.splitlines() == lines and rc == 0


def test_megatrons_first_iteration_report_leaves_no_blank_lines():
    """Megatron's parameter and memory report after iteration 1 ends with an empty line; it
    went to the console as a blank line between iteration lines."""
    report = ["Number of parameters in transformer block in billions:  0.11",
              "Total number of parameters in billions: 0.13",
              "compute_activation_memory_without_sp",
              "Activation memory footprint per transformer layer (precise, without SP): 19 MB",
              "Theoretical memory footprints: weight and optimizer=2309.10 MB, total=3014 MB",
              "",
              "[Rank 0] (after 1 iterations) memory (MB) | allocated: 0.00"]
    second = ITER.replace("iteration        1/", "iteration        2/")
    console, _, _ = _run([f"[rank0]: {ITER}", *(f"[rank0]: {t}" for t in report),
                          f"[rank0]: {second}"])
    assert console == [ITER, second]


def test_two_ranks_on_one_line_are_split():
    console, _, _ = _run([f"[rank0]: partial [rank1]: {ITER}"])
    assert console == ["partial ", ITER]


def test_a_refusal_hides_torchruns_report_that_came_before_it():
    """torchrun may report the failed ranks before the tee delivers the refusal line."""
    report = [FAILED, "Traceback (most recent call last):", "  File \"run.py\", line 1",
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    console, log, rc = _run([*report, "[rank1]: error: TARGET_LENGTH=9: fix it",
                             "[rank0]: error: TARGET_LENGTH=9: fix it"])
    assert console == ["error: TARGET_LENGTH=9: fix it"] and rc == 3
    assert "ChildFailedError" in log
    # a crash without a refusal: the report is shown, at the end
    console, _, rc = _run([*report, "[rank0]: Traceback (most recent call last):",
                           "[rank0]: ZeroDivisionError: division by zero"])
    assert rc == 0 and console[:2] == ["Traceback (most recent call last):",
                                       "ZeroDivisionError: division by zero"]
    assert console[2:] == report


def test_without_a_log_nothing_is_hidden(tmp_path):
    src = io.StringIO("[rank0]: /x.py:1: UserWarning: w\n[rank0]: error: bad\n")
    console = io.StringIO()
    assert run_console(str(tmp_path / "no" / "such" / "dir.log"), src, console) == 3
    out = console.getvalue().splitlines()
    assert out[0].startswith("warning: cannot write the launch log")
    assert out[1:] == ["/x.py:1: UserWarning: w", "error: bad"]
