"""Progress that reads well both in a terminal and in a job log.

In a terminal: a tqdm bar. Anywhere else (Snakemake/SLURM logs, pipes): one plain log line at most
every ``interval`` seconds and at the end, never carriage-return fragments. Both give the rate the
way a person reads it: rounds per second when they are fast, seconds per round once a round takes
more than a second (a training round usually does), as tqdm does.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from tqdm import tqdm


class Progress:
    def __init__(
        self,
        total: int,
        desc: str,
        log: logging.Logger,
        unit: str = "it",
        initial: int = 0,
        interval: float = 30.0,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.clock = clock  # injectable so a test can make a round last exactly 2.5 s without sleeping
        self.total, self.desc, self.log, self.unit, self.interval = total, desc, log, unit, interval
        self.count = initial
        self.enabled = enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, mininterval=2.0)
        self.started = self.last = self.clock()
        self.initial = initial
        self.postfix = ""

    def update(self, n: int = 1, postfix: str = "") -> None:
        self.count += n
        self.postfix = postfix or self.postfix
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix_str(postfix, refresh=False)
            return
        now = self.clock()
        if self.enabled and (now - self.last >= self.interval or self.count >= self.total):
            self.last = now
            done = self.count - self.initial
            rate = done / max(now - self.started, 1e-9)
            eta = (self.total - self.count) / rate if rate > 0 else float("nan")
            self.log.info(
                "%s: %d/%d %s (%s, ~%s left)%s",
                self.desc,
                self.count,
                self.total,
                self.unit,
                rate_text(rate, self.unit),
                _duration(eta),
                f"  {self.postfix}" if self.postfix else "",
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def rate_text(rate: float, unit: str) -> str:
    """``2.5 s/round`` when one unit takes more than a second, else ``4.0 round/s`` (tqdm's rule)."""
    if not rate > 0:  # nothing done yet (or NaN)
        return f"? s/{unit}"
    return f"{1 / rate:.1f} s/{unit}" if rate < 1 else f"{rate:.1f} {unit}/s"


def _duration(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
