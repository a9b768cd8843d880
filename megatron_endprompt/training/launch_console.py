"""The launch script's console: what ``torchrun`` and its ranks print, sorted into a log file
and a quiet console.

``examples/pretrain_llama3_endprompt.sh`` runs ``torchrun --tee 3`` with the line prefix
:data:`RANK_PREFIX`, so each rank's output reaches this filter as whole lines tagged with the
rank (one rank's text never continues another's line), and pipes ``torchrun``'s output through
:class:`LaunchConsole`:

* everything goes to the log file (the script's ``LOG_DIR``, in ``CHECKPOINT_OUT``), as read;
* the console gets the iteration lines and our own lines without the rank tag, but not
  Megatron's argument table (~850 lines)
  nor the library warnings and start-up reports of :data:`NOISE_BLOCKS`/:data:`KNOWN_NOISE`
  (the script says where the log is); a line every rank prints is shown once;
* a rank's one-line refusal (``error: ...``, a :class:`~megatron_endprompt.errors.UserError`
  of the pretrain entry) is remembered: ``torchrun``'s own report of the failed ranks (from
  its ``failed (exitcode: N)`` line to the end: its ``ChildFailedError`` traceback) is held
  until the end, since the tee may deliver the rank's last lines after it, and goes to the
  log only when a rank refused; and
  :attr:`LaunchConsole.refused` tells the script to exit 2 (the launcher's exit code for bad
  input), not ``torchrun``'s 1.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["ARGS_BEGIN", "ARGS_END", "FAILURE_REPORT", "KNOWN_NOISE", "NOISE_BLOCKS", "RANK_PREFIX",
           "LaunchConsole", "run_console", "split_rank"]

#: ``torchrun --log-line-prefix-template``: the tag on every line a rank prints.
RANK_PREFIX = "[rank${rank}]: "
_TAG = re.compile(r"\[rank(\d+)\]: ")
#: torchrun's first line about a failed worker (``E1207 ... api.py:1002] failed (exitcode: 2)``).
FAILURE_REPORT = re.compile(r"^E\d{4} .*\] failed \(exitcode: -?\d+\)")

#: Megatron's argument table (``megatron.training.arguments._print_args``), first and last line.
ARGS_BEGIN = re.compile(r"^-+ arguments -+$")
ARGS_END = re.compile(r"^-+ end of arguments -+$")

#: Library output that says nothing to act on: Python warnings (``path:line: XWarning: ...``,
#: their indented message and source lines after), glog-style ``W``/``I`` lines of torch and
#: torchrun (``W1207 03:08:03.229000 7160 path:183] ...``), torchrun's OMP_NUM_THREADS banner,
#: Python-logging ``INFO:``/``WARNING:`` records of the libraries, and Megatron's start-up
#: reports (gradient buckets, timestamps, parameter counts, memory footprints).
KNOWN_NOISE = tuple(re.compile(p) for p in (
    r"^[WI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ",
    r"^\*{5,}",
    r"^Setting OMP_NUM_THREADS environment variable",
    r"^WARNING: (TensorBoard|one_logger|Logging)",
    r"^\[WARNING +\| ",
    r"^\[[\w ,-]+\] datetime: ",
    r"^Number of (active )?parameters in ",
    r"^Total number of (active )?parameters in ",
    r"^compute_activation_memory_without_sp$",
    r"^Activation memory footprint per transformer layer",
    r"^\[Rank \d+\] \((after|before) [^)]*\) memory \(MB\)",
))
#: Noise whose indented (or blank) lines after it are its own: a Python warning's message and
#: source lines, a logging record's table (Megatron's timers), a gradient bucket's parameters,
#: Megatron's memory report after iteration 1 (an empty line ends it).
NOISE_BLOCKS = tuple(re.compile(p) for p in (
    r"^\S+:\d+: \w*Warning: ",
    r"^(INFO|WARNING):(megatron|torch|root|transformers|datasets)[\w.]*:",
    r"^Params for bucket \d+ ",
    r"^Theoretical memory footprints: ",  # then an empty line
))
_CONTINUATION = re.compile(r"^(\s|$)")
_ITERATION = re.compile(r"^ ?\[[\d :.-]+\] iteration +\d+/")


def split_rank(line: str) -> tuple[int | None, str]:
    """``(rank, text)`` of a line tagged with :data:`RANK_PREFIX`; ``(None, line)`` for one of
    ``torchrun``'s own lines."""
    match = _TAG.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), line[match.end():]


@dataclass(kw_only=True)
class LaunchConsole:
    """Sorts one launch's output; feed it lines with :meth:`feed`."""

    console: TextIO
    """Where the quiet output goes (the user's terminal or the job's output file)."""

    log: TextIO | None
    """The full log (every line as read); ``None``: no log file could be opened."""

    hide: bool = True
    """Keep the argument table and :data:`KNOWN_NOISE` off the console (``False`` when there
    is no log file to hold them)."""

    refused: str | None = None
    """A rank's ``error: ...`` line, once one printed it (the launch was refused)."""

    _held: list | None = None
    _in_table: set = field(default_factory=set)
    _in_block: set = field(default_factory=set)
    _shown: dict = field(default_factory=dict)

    def feed(self, line: str) -> None:
        """One line of ``torchrun``'s output (with its newline or not)."""
        if self.log is not None:
            self.log.write(line if line.endswith("\n") else line + "\n")
        # a partial line of one rank followed by another rank's line: split at the second tag
        parts = [m.start() for m in _TAG.finditer(line)]
        starts = [p for p in parts if p > 0] if parts and parts[0] == 0 else []
        for a, b in zip([0, *starts], [*starts, len(line)]):
            self._one(line[a:b].rstrip("\n"))

    def _one(self, line: str) -> None:
        rank, text = split_rank(line)
        if rank is None and (self._held is not None or FAILURE_REPORT.match(text)):
            self._held = [*(self._held or []), text]  # shown by finish() unless refused
            return
        if self.hide and self._noise(rank, text):
            return
        if rank is not None and text.startswith("error: ") and self.refused is None:
            self.refused = text
        ranks = self._shown.setdefault(text, set())
        if rank is not None and ranks - {rank}:
            return  # another rank printed it already
        ranks.add(rank)
        self._show(text)

    def finish(self) -> None:
        """End of the output: ``torchrun``'s failure report to the console unless a rank
        refused the launch (then its one line says it all and the report is in the log)."""
        if self.refused is None:
            for text in self._held or []:
                self._show(text)
        self._held = None

    def _noise(self, rank: int | None, text: str) -> bool:
        if rank in self._in_table:
            if ARGS_END.match(text):
                self._in_table.discard(rank)
            return True
        if ARGS_BEGIN.match(text):
            self._in_table.add(rank)
            return True
        if rank in self._in_block:
            if _CONTINUATION.match(text) and not _ITERATION.match(text):
                return True
            self._in_block.discard(rank)
        if any(p.search(text) for p in NOISE_BLOCKS):
            self._in_block.add(rank)
            return True
        return any(p.search(text) for p in KNOWN_NOISE)

    def _show(self, text: str) -> None:
        try:
            print(text, file=self.console, flush=True)
        except (BrokenPipeError, OSError):  # the terminal went away: the log keeps going
            pass


def run_console(log_path: str | None, source: TextIO = sys.stdin,
                console: TextIO = sys.stdout) -> int:
    """Filter ``source`` until end of file (when ``torchrun`` and every rank have exited);
    returns 3 when a rank refused the launch, else 0. The log is line-buffered: a killed job
    keeps everything up to its last line."""
    log = None
    if log_path:
        try:
            log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")
        except OSError as exc:
            print(f"warning: cannot write the launch log {log_path} ({exc.strerror}); "
                  "everything goes to the console", file=console, flush=True)
    sorter = LaunchConsole(console=console, log=log, hide=log is not None)
    for line in source:
        sorter.feed(line)
    sorter.finish()
    if log is not None:
        log.close()
    return 3 if sorter.refused is not None else 0
