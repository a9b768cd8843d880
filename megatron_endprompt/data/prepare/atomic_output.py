"""Crash-safe, exclusive writing of a dataset prefix (``PREFIX.bin/.idx/.endprompt``).

Why: a prefix is three files, and no sequence of renames replaces three files atomically;
deleting the old ``.bin`` first (the earlier scheme) lost the old dataset when a kill hit the
commit. Here a *commit journal* makes the swap all-or-nothing:

1. the new files are written to ``PREFIX.<suffix>.tmp-PID`` and ``fsync``-ed;
2. ``PREFIX.commit`` (the journal: the temporary name of every new file) is written atomically
   (temporary + rename + directory ``fsync``). **This rename is the commit point**: before it
   the prefix is the complete old dataset (its files were never touched), after it the prefix
   is the complete new dataset, because anyone who finds the journal rolls it forward;
3. the old ``.idx`` is removed, then the temporaries are renamed over their final names in
   the order ``.endprompt``, ``.bin``, ``.idx``: **the ``.idx`` comes last**;
4. the journal is removed.

A kill between 2 and 4 leaves the journal; :func:`finish_interrupted_commit` (run by the next
preprocessing of the prefix, by ``inspect`` and by the pretrain start-up check) renames the
remaining temporaries (same order) and removes the journal, so every reader sees the new
dataset. Readers that do not know the journal — stock Megatron's ``IndexedDataset``, the
``.bin/.idx`` being Megatron's format — never see a mismatched pair: while a commit is
unfinished there is no ``PREFIX.idx`` at all (the old one was removed first, the new one
arrives last, after its ``.bin``), so they stop at the missing ``.idx`` (Megatron's
``FileNotFoundError``) instead of reading new offsets into the old ``.bin``. Before the
commit point they read the complete old pair, after the last rename the complete new one.

The prefix is also *exclusive*: ``PREFIX.lock`` is held for the whole run (the package's one
file lock, :func:`megatron_endprompt.disk.exclusive`), so a second run writing the same prefix
stops at once with one ``error:`` line instead of mixing its files with the first run's. Under the
lock, temporaries left by dead processes (``PREFIX.bin.tmp-PID`` after a ``SIGKILL``) are removed.

Fault injection: with ``MEGATRON_ENDPROMPT_FAULT_COMMIT_STEP=k`` the process ``os._exit``-s
right after commit step ``k`` (see :data:`COMMIT_STEPS`), as a kill would; the reliability
tests run every ``k`` and check the prefix loads as the old or the new dataset.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

from megatron_endprompt import disk
from megatron_endprompt.disk import fsync_dir, pid_alive
from megatron_endprompt.errors import UserError

__all__ = ["SUFFIXES", "COMMIT_STEPS", "FAULT_ENV", "PrefixWriter", "check_output_prefix",
           "check_targets", "written_paths", "prefix_lock", "finish_interrupted_commit",
           "ensure_committed", "remove_stale_temporaries", "pid_alive"]

SUFFIXES = (".bin", ".idx", ".endprompt")
JOURNAL = ".commit"
LOCK = ".lock"
FAULT_ENV = "MEGATRON_ENDPROMPT_FAULT_COMMIT_STEP"
#: Commit steps after which a fault can be injected (index = ``k``).
COMMIT_STEPS = ("temporaries written", "temporaries synced", "journal written",
                "removed old .idx", "renamed .endprompt", "renamed .bin", "renamed .idx",
                "journal removed")
#: ``.idx`` last: a reader without the journal finds no ``.idx`` until ``.bin`` is new.
_RENAME_ORDER = (".endprompt", ".bin", ".idx")


def _remove_old_idx(tmp_idx: str, idx: str) -> None:
    """Step 3: unlink the final ``.idx`` while its replacement ``tmp_idx`` is still a
    temporary (so a stock reader never pairs the old ``.idx`` with the new ``.bin``)."""
    if os.path.exists(tmp_idx):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(idx)


def _fault(step: int) -> None:
    if os.environ.get(FAULT_ENV) == str(step):
        os._exit(137)  # as SIGKILL would: no cleanup, no flush


def check_output_prefix(prefix: str, *, flag: str = "--output-prefix") -> None:
    """Refuse a prefix that names a directory (``dir/`` would write hidden ``dir/.bin``)."""
    if not prefix or prefix.endswith(("/", os.sep)) or os.path.isdir(prefix) \
            or os.path.basename(prefix) in ("", ".", ".."):
        raise UserError(f"{flag} {prefix!r} names a directory; give a file-name prefix inside "
                        f"it, e.g. {os.path.join(prefix.rstrip('/') or '.', 'data')}")


def written_paths(prefix: str, sidecar: str | None = None) -> list[str]:
    """Every name a write of ``prefix`` creates or replaces: ``.bin``, ``.idx``, the sidecar
    (``sidecar``, default ``PREFIX.endprompt``), the lock and the commit journal."""
    return [prefix + ".bin", prefix + ".idx", sidecar or prefix + ".endprompt", prefix + LOCK,
            _journal(prefix)]


def check_targets(prefix: str, sidecar: str | None = None, *, flag: str = "--output-prefix",
                  corpus: bool = True) -> None:
    """Refuse a target name that is a directory before any work: the commit's rename onto it
    would fail after everything was computed (and past the commit point, leave a journal
    that can never roll forward). ``corpus=False``: only the sidecar and the lock are written
    (a sidecar build over an existing ``.bin/.idx``)."""
    paths = written_paths(prefix, sidecar) if corpus else [sidecar or prefix + ".endprompt",
                                                           prefix + LOCK]
    for path in paths:
        if os.path.isdir(path):
            raise UserError(f"{flag} {prefix}: {path} is a directory, and this run must write "
                            "a file there; move it away or choose another prefix")


def prefix_lock(prefix: str, *, flag: str = "--output-prefix",
                wait_s: float = 0.0) -> contextlib.AbstractContextManager[None]:
    """Hold ``PREFIX.lock`` exclusively: :func:`~megatron_endprompt.disk.exclusive` (the
    package's one lock) with the prefix's messages; another holder -> :class:`UserError` (after
    waiting up to ``wait_s`` seconds)."""
    return disk.exclusive(prefix + LOCK, who=f"{flag} {prefix}", wait_s=wait_s,
                          make_parents=False,
                          busy=f"{flag} {prefix}: another run (pid {{pid}}) is writing this "
                               "prefix; wait for it to finish or choose another prefix")


def _journal(prefix: str) -> str:
    return prefix + JOURNAL


def finish_interrupted_commit(prefix: str) -> bool:
    """Roll an interrupted commit forward (caller holds the lock); True if there was one."""
    journal = _journal(prefix)
    if not os.path.exists(journal):
        return False
    directory = os.path.dirname(os.path.abspath(prefix))
    try:
        with open(journal, encoding="utf-8") as f:
            entry = json.load(f)
        files = entry["files"]
        targets = entry.get("targets") or {s: os.path.basename(prefix + s) for s in files}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{journal}: unreadable commit journal ({exc}); remove it and re-run "
                        "tools/preprocess_endprompt.py for this prefix") from None
    _remove_old_idx(os.path.join(directory, files[".idx"]),
                    os.path.join(directory, targets[".idx"]))
    for suffix in _RENAME_ORDER:
        tmp = os.path.join(directory, files[suffix])
        if os.path.exists(tmp):
            os.replace(tmp, os.path.join(directory, targets[suffix]))
    fsync_dir(directory)
    os.unlink(journal)
    fsync_dir(directory)
    return True


def ensure_committed(prefix: str, *, flag: str = "data prefix") -> None:
    """For readers: finish an interrupted commit of ``prefix`` if one is pending (waits for a
    writer that is committing right now); one :class:`UserError` line when it cannot."""
    if not os.path.exists(_journal(prefix)):
        return
    try:
        with prefix_lock(prefix, flag=flag, wait_s=60.0):
            finish_interrupted_commit(prefix)
    except OSError as exc:
        raise UserError(f"{flag} {prefix}: an interrupted preprocessing commit cannot be "
                        f"finished ({exc.strerror}); re-run tools/preprocess_endprompt.py for "
                        "this prefix in a writable directory") from None


def remove_stale_temporaries(prefix: str) -> list[str]:
    """Remove ``PREFIX.<suffix>.tmp-PID`` of processes that no longer exist (caller holds the
    lock); returns the paths removed."""
    return [path for suffix in (*SUFFIXES, JOURNAL)
            for path in disk.remove_stale_temporaries(prefix + suffix)]


class PrefixWriter:
    """The temporaries of one preprocessing run and their commit; holds the prefix lock from
    construction to :meth:`close`.

    ``tmp``: ``{".bin": ..., ".idx": ..., ".endprompt": ...}`` temporary paths to write;
    ``sidecar``: the sidecar's final path (``PREFIX.endprompt``, or ``PREFIX.NAME.endprompt``
    for a named layout).
    """

    def __init__(self, prefix: str, *, sidecar: str | None = None) -> None:
        check_output_prefix(prefix)
        check_targets(prefix, sidecar)
        self.prefix = prefix
        self.targets = {".bin": prefix + ".bin", ".idx": prefix + ".idx",
                        ".endprompt": sidecar or prefix + ".endprompt"}
        self.directory = os.path.dirname(os.path.abspath(prefix))
        self._lock = prefix_lock(prefix)
        self._lock.__enter__()
        try:
            finish_interrupted_commit(prefix)
            remove_stale_temporaries(prefix)
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        tag = f".tmp-{os.getpid()}"
        self.tmp = {s: prefix + s + tag for s in SUFFIXES}
        self._journaled = False
        self._closed = False

    def commit(self) -> None:
        """Make the temporaries the prefix (see the module docstring); SIGINT/SIGTERM are held
        back until it is done, so a handled signal never splits it."""
        _fault(0)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for path in self.tmp.values():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            _fault(1)
            journal = _journal(self.prefix)
            tmp_journal = journal + f".tmp-{os.getpid()}"
            with open(tmp_journal, "w", encoding="utf-8") as f:
                json.dump({"pid": os.getpid(),
                           "files": {s: os.path.basename(p) for s, p in self.tmp.items()},
                           "targets": {s: os.path.basename(p)
                                       for s, p in self.targets.items()}}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_journal, journal)  # the commit point
            self._journaled = True
            fsync_dir(self.directory)
            _fault(2)
            _remove_old_idx(self.tmp[".idx"], self.targets[".idx"])
            _fault(3)
            for k, suffix in enumerate(_RENAME_ORDER, 4):
                os.replace(self.tmp[suffix], self.targets[suffix])
                _fault(k)
            fsync_dir(self.directory)
            os.unlink(journal)
            fsync_dir(self.directory)
            self._journaled = False
            _fault(7)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def close(self) -> None:
        """Remove what was not committed and release the lock (idempotent). A commit that
        passed its commit point but failed (e.g. a full disk at a rename) is rolled forward."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._journaled:  # past the commit point: finish, keep temporaries otherwise
                with contextlib.suppress(OSError, UserError):
                    finish_interrupted_commit(self.prefix)
                    self._journaled = False
            if not self._journaled:
                for path in (*self.tmp.values(), _journal(self.prefix) + f".tmp-{os.getpid()}"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        finally:
            self._lock.__exit__(None, None, None)
