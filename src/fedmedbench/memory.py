"""A process's memory as a job scheduler sees it (Linux ``/proc/<pid>/smaps_rollup``).

- ``private_anon``: anonymous pages (the kernel's ``Anonymous``): heap, tensors, numpy arrays. This
  is the job's own memory; nothing else can use or free it.
- ``file_resident``: resident pages backed by a file (``Rss - Anonymous``): the memory-mapped store
  and the libraries. They live in the page cache, are shared by every job that maps the same file
  and can be dropped and re-read at any time, but a memory cgroup charges them to the job that first
  touched them, and RSS-based accounting (e.g. SLURM's ``jobacct_gather/linux``) counts them in full.

``PeakMemory`` samples both on a thread while a block runs and keeps their maxima, which is how
``benchmarks/bench_memory.py`` and ``tests/test_memory.py`` check that a job's private memory does
not grow with the size of the store it reads.
"""

from __future__ import annotations

import threading
from pathlib import Path


def memory_now(pid: int | str = "self") -> dict[str, int]:
    """``{"rss", "private_anon", "file_resident"}`` of a process, in bytes."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[name.strip()] = int(parts[0]) * 1024
    rss, anon = fields["Rss"], fields["Anonymous"]
    return {"rss": rss, "private_anon": anon, "file_resident": rss - anon}


class PeakMemory:
    """Maxima of ``memory_now`` over a ``with`` block, sampled every ``interval`` seconds (and at
    both ends). ``peak`` holds them after the block."""

    def __init__(self, interval: float = 0.005, pid: int | str = "self"):
        self.interval, self.pid = interval, pid
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        for key, value in memory_now(self.pid).items():
            self.peak[key] = max(self.peak.get(key, 0), value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread = threading.Thread(target=self._run, name="fedmedbench-peak-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
