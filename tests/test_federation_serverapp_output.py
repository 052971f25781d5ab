"""What the ServerApp tells and writes about a run (federation.serverapp): a line per round on its
output, which ``flwr run --stream`` shows; ``resuming from round k`` when a restarted server continues
a checkpoint; ``federation.json`` counting the whole run (the part before the checkpoint, then the
resumed part) with the run id that finished it; and no ``warm.sock`` left by a local federation's warm
app server once it has ended.

The ServerApp's ``run`` is driven here by the in-process grid of tests/test_federation_resume.py: Flower
``Message``s answered by the ClientApp's own handlers (no Flower process)."""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from fedmedbench.errors import FedmedbenchError  # noqa: E402
from fedmedbench.federation import serverapp  # noqa: E402
from tests.conftest import tiny_run_config  # noqa: E402
from tests.test_federation_resume import InProcessGrid, Stop, task_identity  # noqa: E402,F401  (a fixture)

ROUND_LINE = re.compile(r"^tiny/fedavg/seed0: (\d)/2 round \(.*\)  mean val dice_paper \d\.\d{4}")


def serverapp_run(tmp_path: Path, out: Path, run_id: int, grid: InProcessGrid) -> dict:
    """The ServerApp's run (``serverapp.run``, as its ``main`` calls it under the run lock) into
    ``out``; returns its federation.json."""
    settings = {"run-config": str(tmp_path / "run.json"), "out": str(out), "nodes-timeout": 5}
    context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=settings)
    serverapp.run(grid, context, settings, out, resume=True)
    return json.loads((out / "federation.json").read_text())


def grid_for(tmp_path: Path, tiny_task, name: str) -> InProcessGrid:
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=2)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    return InProcessGrid(
        tmp_path / name,
        {n: {"store": str(store), "split": str(split)} for n in cfg["clients"]},
        tmp_path / name / "out",
    )


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("fedmedbench")]


@pytest.mark.usefixtures("task_identity")
def test_a_line_per_round_then_a_resumed_run_says_so_and_counts_the_whole_run(tmp_path, tiny_task, caplog):
    caplog.set_level(logging.INFO, logger="fedmedbench")
    # Uninterrupted: a line per round, as `fedmedbench train` prints.
    whole = serverapp_run(tmp_path, tmp_path / "whole" / "out", 11, grid_for(tmp_path, tiny_task, "whole"))
    assert [int(ROUND_LINE.match(line).group(1)) for line in lines(caplog) if ROUND_LINE.match(line)] == [1, 2], lines(
        caplog
    )
    assert not any("resuming" in line for line in lines(caplog))
    assert whole["run_id"] == 11 and whole["resumed_after"] == [] and whole["messages_sent"] > 0
    # Stopped as round 2's training messages went out (round 1 checkpointed), then restarted.
    grid = grid_for(tmp_path, tiny_task, "resumed")
    out = tmp_path / "resumed" / "out"
    grid.stop_at = ("train", 2)
    with pytest.raises(Stop):
        serverapp_run(tmp_path, out, 12, grid)
    round_2_trains = sum(1 for step in grid.sent if step == ("train", 2))
    counted_before = len(grid.sent) - round_2_trains  # what the server had sent at round 1's checkpoint
    grid.stop_at, grid.sent = None, []
    caplog.clear()
    resumed = serverapp_run(tmp_path, out, 13, grid)
    said = lines(caplog)
    resuming = f"tiny/fedavg/seed0: resuming from round 2 (the checkpoint after round 1 in {out / 'checkpoint.pt'})"
    assert [line for line in said if "resuming" in line or ROUND_LINE.match(line)] == [
        resuming,
        said[-1],
    ] and ROUND_LINE.match(said[-1]).group(1) == "2", said
    # federation.json: the whole run's messages (before the checkpoint and after the restart), the run
    # that finished it and where it resumed; the counts kept for the resume are gone.
    assert resumed["messages_sent"] == counted_before + len(grid.sent), (resumed, counted_before, len(grid.sent))
    assert resumed["run_id"] == 13 and resumed["resumed_after"] == [1]
    # More than the uninterrupted run's (hello twice, the resume), never only the resumed part.
    for key in ("messages_sent", "bytes_sent", "bytes_received"):
        assert resumed[key] > whole[key], key
    assert not serverapp.traffic_file(out).exists()


def test_the_serverapps_lines_reach_its_output_where_nothing_else_logs(monkeypatch, capsys):
    """Flower configures only its own logger: without ``show_progress`` the per-round lines went nowhere."""
    ours = logging.getLogger("fedmedbench")
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    serverapp.show_progress()
    logging.getLogger("fedmedbench.federation").info("tiny/fedavg/seed0: 1/3 round (2.0 s/round, ~4 s left)")
    assert capsys.readouterr().out == "tiny/fedavg/seed0: 1/3 round (2.0 s/round, ~4 s left)\n"


@pytest.mark.slow
def test_no_warm_socket_is_left_once_a_local_federation_has_ended(tmp_path, monkeypatch):
    """Started twice, each time ended at the SuperLink's start: in its folder (``warm.sock``) and, for a
    folder whose path is too long for a Unix socket, in a temporary folder, which goes too."""
    from fedmedbench.federation import local, warm

    started = []
    real_start = warm.start

    def recording(workdir, env):
        server, launchers = real_start(workdir, env)
        started.append(server.socket_path)
        assert server.socket_path.exists()
        return server, launchers

    def no_superlink(*args, **kwargs):
        raise FedmedbenchError("stopped here by the test")

    monkeypatch.setattr(warm, "start", recording)
    monkeypatch.setattr(local, "spawn", no_superlink)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    short = Path(tempfile.mkdtemp(prefix="fed-"))
    for workdir in (short, tmp_path / ("long-" + "x" * 100)):
        with (
            pytest.raises(FedmedbenchError, match="stopped here by the test"),
            local.local_federation({}, workdir, warm=True),
        ):
            pass
    assert started[0] == short / "warm.sock" and started[1].parent.name.startswith("fmb-warm-")
    assert not started[0].exists() and not started[1].exists() and not started[1].parent.exists()
