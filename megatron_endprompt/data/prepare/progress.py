"""Progress of the data tools: a tqdm bar on a terminal, plain periodic lines in a log file.

Why: under a batch system (SLURM) stderr is a file; tqdm then prints nothing (or carriage
returns), and a rate measured from when the *consumer* started is wrong when the work began
earlier (preprocessing tokenizes while torch imports, then drains a backlog: "343,056,101
tokens/s, ETA 0 s" at 3%). Here every rate is measured from ``started`` (when the work
began), the ETA comes from the *bytes* (or items) done against the total, and a line is
printed, flushed, every ``every_items`` items or ``every_s`` seconds, whichever comes first
(never more than one a second), plus a last line at :meth:`close`.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """``update(n, tokens=...)`` after each item; ``close()`` at the end.

    ``total``: the amount (bytes, or items) the run will reach; ``unit``: ``"B"`` (shown in
    MiB) or an item name; ``enabled``: ``False`` prints nothing; ``started``: the
    ``time.perf_counter()`` at which the work began (default: now).
    """

    def __init__(self, total: int, *, unit: str = "B", enabled: bool = True,
                 started: float | None = None, every_items: int = 1000, every_s: float = 30.0,
                 stream=None, clock=time.perf_counter) -> None:
        self.total, self.unit, self.enabled = total, unit, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.t0 = clock() if started is None else started
        self.every_items, self.every_s = every_items, every_s
        self.done = self.items = self.tokens = 0
        self._last_line = self.t0
        self._items_at_line = 0
        self.bar = None
        if enabled and _isatty(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, unit_scale=unit == "B",
                            unit_divisor=1024, smoothing=0.1, file=self.stream)

    def update(self, amount: int = 1, *, tokens: int | None = None) -> None:
        """``amount`` more done (bytes or items); ``tokens``: the running total, if counted."""
        self.done += amount
        self.items += 1
        if tokens is not None:
            self.tokens = tokens
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(amount)
            if tokens is not None and self.items % 256 == 0:
                self.bar.set_postfix_str(f"{self.items:,} docs, {self.rate_tokens():,.0f} tokens/s")
            return
        now = self.clock()
        since = now - self._last_line
        if since >= 1.0 and (self.items - self._items_at_line >= self.every_items
                             or since >= self.every_s):
            self._line(now)

    def rate_tokens(self, now: float | None = None) -> float:
        """Tokens per second since the work began."""
        return self.tokens / max((self.clock() if now is None else now) - self.t0, 1e-3)

    def eta(self, now: float) -> float | None:
        """Seconds left at the mean rate so far (``None`` before anything is done)."""
        if self.done <= 0:
            return None
        return max(self.total - self.done, 0) * (now - self.t0) / self.done

    def message(self, now: float) -> str:
        """One log line (no carriage return)."""
        elapsed = now - self.t0
        if self.unit == "B":
            amount = f"{self.done / 2**20:,.1f} of {self.total / 2**20:,.1f} MiB"
            what = f"{self.items:,} documents, "
        else:
            amount = f"{self.done:,} of {self.total:,} {self.unit}"
            what = ""
        pct = 100 * self.done / max(self.total, 1)
        parts = [f"{what}{amount} ({pct:.1f}%)", f"{elapsed:,.0f} s elapsed"]
        if self.unit == "B":
            parts.append(f"{self.done / 2**20 / max(elapsed, 1e-3):,.2f} MiB/s")
        if self.tokens:
            parts.append(f"{self.rate_tokens(now):,.0f} tokens/s")
        eta = self.eta(now)
        if eta is not None and self.done < self.total:
            parts.append(f"ETA {_duration(eta)}")
        return "progress: " + ", ".join(parts)

    def _line(self, now: float) -> None:
        print(self.message(now), file=self.stream, flush=True)
        self._last_line, self._items_at_line = now, self.items

    def close(self) -> None:
        """Close the bar, or print the last line (when anything was counted)."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.items:
            self._line(self.clock())


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    """``42 s``, ``12 min 5 s``, ``3 h 7 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s" if seconds >= 1 else "< 1 s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
