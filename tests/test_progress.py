"""Progress in a job log: rounds per second when fast, seconds per round once a round takes more than
a second. A fake clock makes each round last exactly what the test says, no sleeping."""

import io
import logging
import sys

import pytest

from fedmedbench.progress import Progress, rate_text

LOG = logging.getLogger("fedmedbench.test_progress")


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def run_rounds(
    monkeypatch, caplog, seconds_per_round: float, total: int = 4, initial: int = 0, interval: float = 0.0
) -> list[str]:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: plain log lines, as in a job log
    clock = FakeClock()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        bar = Progress(
            total, "prostate/fedavg/seed0", LOG, unit="round", initial=initial, interval=interval, clock=clock
        )
        for _ in range(total - initial):
            clock.now += seconds_per_round
            bar.update(1)
        bar.close()
    return [r.getMessage() for r in caplog.records if r.name == LOG.name]


def test_slow_rounds_read_as_seconds_per_round(monkeypatch, caplog):
    lines = run_rounds(monkeypatch, caplog, 2.5)
    # 3 rounds left at 2.5 s each: 7.5 s, shown as whole seconds.
    assert lines[0] == "prostate/fedavg/seed0: 1/4 round (2.5 s/round, ~0m07s left)"
    assert lines[-1] == "prostate/fedavg/seed0: 4/4 round (2.5 s/round, ~0m00s left)"
    assert len(lines) == 4 and all("round/s" not in line for line in lines)


def test_fast_rounds_read_as_rounds_per_second(monkeypatch, caplog):
    lines = run_rounds(monkeypatch, caplog, 0.25)
    assert lines[0] == "prostate/fedavg/seed0: 1/4 round (4.0 round/s, ~0m00s left)"
    assert all("s/round" not in line for line in lines)


def test_a_round_of_exactly_one_second_is_not_more_than_a_second(monkeypatch, caplog):
    assert run_rounds(monkeypatch, caplog, 1.0)[0] == "prostate/fedavg/seed0: 1/4 round (1.0 round/s, ~0m03s left)"
    assert run_rounds(monkeypatch, caplog, 1.25)[0] == "prostate/fedavg/seed0: 1/4 round (1.2 s/round, ~0m03s left)"


def test_a_resumed_run_rates_only_the_rounds_it_ran(monkeypatch, caplog):
    # Resumed at round 6 of 10: 4 rounds of 90 s each in this process, not 10 rounds in 360 s.
    lines = run_rounds(monkeypatch, caplog, 90.0, total=10, initial=6)
    assert lines[0] == "prostate/fedavg/seed0: 7/10 round (90.0 s/round, ~4m30s left)"


def test_log_lines_at_most_every_interval_and_at_the_end(monkeypatch, caplog):
    # 20 s rounds, a line at most every 30 s: after rounds 2 (40 s) and 4 (80 s, also the end).
    lines = run_rounds(monkeypatch, caplog, 20.0, total=4, interval=30.0)
    assert [line.split(" (")[0] for line in lines] == [
        "prostate/fedavg/seed0: 2/4 round",
        "prostate/fedavg/seed0: 4/4 round",
    ]
    assert lines[-1].endswith("(20.0 s/round, ~0m00s left)")


@pytest.mark.parametrize(
    "rate, text",
    [
        (0.4, "2.5 s/round"),
        (1.0, "1.0 round/s"),
        (12.0, "12.0 round/s"),
        (0.0, "? s/round"),
        (float("nan"), "? s/round"),
    ],
)
def test_rate_text(rate, text):
    assert rate_text(rate, "round") == text


def test_terminal_bar_shows_seconds_per_round_too(monkeypatch):
    """On a terminal tqdm draws the bar; its unit is 'round', so tqdm's own rule gives s/round."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = Progress(4, "prostate/fedavg/seed0", LOG, unit="round", interval=0.0)
    assert bar.bar is not None
    bar.update(2)
    meter = bar.bar.format_meter(**{**bar.bar.format_dict, "elapsed": 5.0})  # 2 rounds in 5 s
    bar.close()
    assert "2.50s/round" in meter and "round/s" not in meter
