"""A restarted ServerApp resumes from its last checkpoint as the engine does (fl/rounds.serve,
federation.clientapp's snapshots).

The end-to-end test starts one real ``flower-superlink`` and three ``flower-supernode`` processes
(free ports of 127.0.0.1) and uses them for both runs: the first ``flwr run`` is killed (SIGKILL,
the ``kill-at`` test hook) in round 3 after the sites trained, i.e. after round 2's checkpoint;
the second ``flwr run`` (a new Flower run id) finds the checkpoint, tells the sites to go back to
round 2 (each restores the snapshot it took when told of that checkpoint) and finishes round 3. Its
run folder equals the engine's uninterrupted run byte for byte. Skipped where the ``flower`` extra
is not installed."""

import filecmp
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedmedbench.files import try_flock  # noqa: E402
from fedmedbench.fl.engine import run_training  # noqa: E402
from fedmedbench.fl.runlock import LOCK_NAME  # noqa: E402
from tests.conftest import tiny_run_config  # noqa: E402

OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz")


def flwr(federation, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """The ``flwr`` CLI against this federation's SuperLink (its ``$FLWR_HOME``)."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("flwr")), *args],
        env=federation.env,
        cwd=federation.workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def killed_in_round_3(workdir: Path, out: Path, clients) -> bool:
    """The first server is gone: round 2 checkpointed, each site told of it on round 3's train
    message (its snapshot of round 2 taken) and trained round 3 (its state file mid-round), after
    which the server's next statement is the kill (``round_trained:3``): it sends nothing more."""
    from fedmedbench.federation.clientapp import round_done

    if not (out / "checkpoint.pt").is_file():
        return False
    for name in clients:
        state = list((workdir / f"site-{name}" / "state").glob(f"run-*/{name}.pt"))
        if not state or not state[0].with_name(f"{name}.round-2.pt").is_file():
            return False
        try:
            if round_done(state[0]) is not None:
                return False
        except Exception:  # being replaced this instant
            return False
    # The sites are done with round 3 a moment before the server has their replies and reaches its
    # kill: until then it still holds the run folder's lock, and a second run would be refused.
    handle = try_flock(out / LOCK_NAME)
    if handle is None:
        return False
    handle.close()
    return True


# `make test`'s one real federation (a SuperLink, three SuperNodes, a restart; ~40 s on an idle machine).
@pytest.mark.federation
def test_a_restarted_server_resumes_from_its_checkpoint_as_the_engine(tmp_path, tiny_task):
    from fedmedbench.federation.local import APP_DIR, CONNECTION, local_federation, toml_value

    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=3)
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    out = tmp_path / "flower"
    settings = {"run-config": str(tmp_path / "run.json"), "out": str(out)}
    sites = {name: {"store": str(store), "split": str(split)} for name in cfg["clients"]}
    workdir = tmp_path / "federation"
    with local_federation(sites, workdir, warm=True) as federation:
        # The first run, submitted without following its log: a SIGKILLed ServerApp's run stays
        # "running" on the SuperLink until its heartbeat expires, so `--stream` would wait for that.
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in {**settings, "kill-at": "round_trained:3"}.items())
        started = flwr(federation, "run", str(APP_DIR), CONNECTION, "--run-config", overrides)
        run_id = re.search(r"started run (\d+)", started.stdout + started.stderr)
        assert run_id, started.stdout + started.stderr
        deadline = time.monotonic() + 600  # ~40 s on an idle machine; generous for a loaded CI runner
        while not killed_in_round_3(workdir, out, cfg["clients"]):
            assert time.monotonic() < deadline, (workdir / "superlink.log").read_text()[-3000:]
            time.sleep(0.5)
        assert not (out / "final.json").exists()
        flwr(federation, "stop", run_id.group(1), CONNECTION)  # tidy the SuperLink's view of the dead run
        # Each site keeps the snapshots of the two latest checkpointed rounds it was told of.
        for name in cfg["clients"]:
            assert sorted(p.name for p in (workdir / f"site-{name}" / "state").glob(f"run-*/{name}.round-*.pt")) == [
                f"{name}.round-1.pt",
                f"{name}.round-2.pt",
            ], name
        first = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in workdir.glob("site-*/state/run-*/*.round-1.pt")}
        resumed = federation.run(settings, timeout=600)  # a new Flower run id, the same state folders
    log = resumed.stdout[-4000:] + resumed.stderr[-2000:]
    # Resumed, not started afresh (which would equal the engine too): a fresh setup deletes every
    # snapshot and writes round 1's anew; a resume after round 2 leaves round 1's untouched.
    assert len(first) == 3 and all((p.stat().st_ino, p.stat().st_mtime_ns) == seen for p, seen in first.items()), log
    for name in OUTPUTS:
        assert (out / name).is_file(), log
        assert filecmp.cmp(tmp_path / "engine" / name, out / name, shallow=False), name
    assert not (out / "checkpoint.pt").exists()  # finished: the outputs replace the checkpoints


# --- the same protocol in this process: Flower Messages answered by the ClientApp's own handlers ---
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedmedbench.federation import clientapp  # noqa: E402
from fedmedbench.federation.serverapp import FlowerTransport, read_run_config  # noqa: E402
from fedmedbench.fl.rounds import SiteError, serve  # noqa: E402

HANDLERS = {
    "query.hello": clientapp.hello, "query.setup": clientapp.setup, "query.resume": clientapp.resume, "train": clientapp.train,
    "query.answer": clientapp.answer, "evaluate": clientapp.evaluate, "query.keep": clientapp.keep, "query.final": clientapp.final,
}  # fmt: skip


class Stop(Exception):
    """The server 'dies' here (an exception instead of SIGKILL: the same files are left behind)."""


class InProcessGrid:
    """Node ``100 + i`` is site ``i``; each message is answered by the ClientApp's handler, with the
    node's config and its own state folder. ``stop_at``: (message type, round) at which the server dies
    once its messages of that step are answered."""

    def __init__(self, tmp_path, sites: dict[str, dict], out):
        self.contexts = {
            100 + i: Context(run_id=1, node_id=100 + i, node_config={"client": name, "state-dir": str(tmp_path / f"site-{name}"), **config}, state=RecordDict(), run_config={"out": str(out)})
            for i, (name, config) in enumerate(sites.items())
        }  # fmt: skip
        self.stop_at = None
        self.sent: list[tuple[str, int | None]] = []  # (message type, round) of every message

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        """Answered at once (Flower's ``Grid`` API: ids now, replies on ``pull_messages``)."""
        self.replies = {}
        for number, message in enumerate(messages):
            self.sent.append((message.metadata.message_type, message.content["c"].get("round")))
            message.metadata.__dict__["_message_id"] = f"m{number}"  # as Flower's InMemoryGrid stamps it
            self.replies[f"m{number}"] = HANDLERS[message.metadata.message_type](
                message, self.contexts[message.metadata.dst_node_id]
            )
        if (
            self.stop_at
            and messages
            and (messages[0].metadata.message_type, messages[0].content["c"].get("round")) == self.stop_at
        ):
            raise Stop()
        return list(self.replies)

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]

    def send_and_receive(self, messages, timeout=None):
        return self.pull_messages(self.push_messages(messages))


@pytest.fixture
def task_identity(monkeypatch):
    """Flower stamps a message with the process's run and task ids; a SuperNode sets them, here we do."""
    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, key, value)


def start_run(tmp_path, tiny_task, rounds=3, **overrides):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=rounds, **overrides)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    run = read_run_config(str(tmp_path / "run.json"))
    grid = InProcessGrid(
        tmp_path, {n: {"store": str(store), "split": str(split)} for n in cfg["clients"]}, tmp_path / "flower"
    )
    return cfg, run, grid


def test_a_server_stopped_mid_round_resumes_from_the_sites_snapshots(tmp_path, tiny_task, task_identity):
    cfg, run, grid = start_run(tmp_path, tiny_task, rounds=4)
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    grid.stop_at = ("evaluate", 4)  # round 4 trained and evaluated on the sites, not recorded by the server
    with pytest.raises(Stop):
        serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    state = next((tmp_path / "site-A").glob("run-*"))
    # Rounds 1-3 checkpointed, each announced on the next train message; the two latest snapshots kept.
    assert sorted(p.name for p in state.glob("A.round-*.pt")) == ["A.round-2.pt", "A.round-3.pt"]
    assert clientapp.round_done(state / "A.pt") == 4  # the state file is past the checkpoint
    grid.stop_at, grid.sent = None, []
    serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    # Resumed (a fresh start would equal the engine too): no setup, back to round 3, then round 4 only.
    assert {step for step in grid.sent if step[0] != "query.hello"} == {
        ("query.resume", 3),
        ("train", 4),
        ("evaluate", 4),
        ("query.final", None),
    } | ({("query.keep", 4)} & set(grid.sent))
    for name in OUTPUTS:
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "flower" / name, shallow=False), name


def test_a_site_that_cannot_go_back_to_the_checkpointed_round_is_refused(tmp_path, tiny_task, task_identity):
    cfg, run, grid = start_run(tmp_path, tiny_task, rounds=2)
    grid.stop_at = ("train", 2)  # killed after the sites snapshotted round 1 and trained round 2
    with pytest.raises(Stop):
        serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    for snapshot in (tmp_path / "site-B").glob("run-*/B.round-*.pt"):
        snapshot.unlink()  # site B's disk lost it (its state file is mid-round 2)
    grid.stop_at = None
    with pytest.raises(
        SiteError,
        match=r"^resume after round 1: site B: cannot resume after round 1: no snapshot of that round .*mid-round\); refused$",
    ):
        serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    assert (tmp_path / "flower" / "checkpoint.pt").is_file() and not (tmp_path / "flower" / "final.json").exists()


# --- keep rides on the next message (no message of its own) -------------------------------------------
def keeps_sent(grid) -> list[tuple[str, str, int | None, int]]:
    """(site, message type, round, keep) of every message that carries a ``keep``, from now on."""
    carried, push = [], grid.push_messages

    def recording(messages):
        for message in messages:
            config = message.content["c"]
            if "keep" in config:
                site = grid.contexts[message.metadata.dst_node_id].node_config["client"]
                carried.append((site, message.metadata.message_type, config.get("round"), int(config["keep"])))
        return push(messages)

    grid.push_messages = recording
    return carried


def test_a_keep_rides_on_the_sites_next_message(tmp_path, tiny_task, task_identity):
    """No ``keep`` message: a round is train and evaluate; a site covered by an improved selection is
    told on its next message (the next round's train, or final) and keeps first; the run folder
    equals the engine's byte for byte."""
    cfg, run, grid = start_run(tmp_path, tiny_task, rounds=3, selection_scope="per_client")
    engine = run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    carried = keeps_sent(grid)
    serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    kinds = [kind for kind, _ in grid.sent]
    assert "query.keep" not in kinds and kinds.count("train") == kinds.count("evaluate") == 3 * 3
    assert len(kinds) == 3 + 3 + 2 * 3 * 3 + 3  # hello, setup, 2 steps x 3 rounds x 3 sites, final
    for _, kind, round_index, keep in carried:  # round r's keep on round r+1's train, round 3's on final
        assert (kind, keep) in (("train", (round_index or 0) - 1), ("query.final", 3))
    last = {site: keep for site, _, _, keep in carried}
    assert last == engine["selection"]["best_round"]  # each site's last keep is its selected round
    for name in OUTPUTS:
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "flower" / name, shallow=False), name


def test_a_server_killed_before_a_keep_was_carried_tells_the_sites_on_resume(
    tmp_path, tiny_task, task_identity, monkeypatch
):
    """The server dies right after checkpointing the round its selection last improved: that round's
    keep rode on no message, so the sites' state files lack it. The restarted server's ``resume``
    carries it (its restored selection kept them at that round), the sites apply it, and the run
    folder equals the engine's byte for byte."""
    from fedmedbench import faults
    from fedmedbench.fl import checkpoint

    cfg, run, grid = start_run(tmp_path, tiny_task, rounds=3)
    engine = run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    best, ends = engine["selection"]["best_round"], []

    def reached(point):
        ends.append(point)
        if ends.count("round_end") == best:
            raise Stop()

    monkeypatch.setattr(faults, "reached", reached)
    with pytest.raises(Stop):
        serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    saved = checkpoint.load_plain(next((tmp_path / "site-A").glob("run-*")) / "A.pt")
    assert (
        saved["round_done"] == best and (saved["site"]["kept"] or {}).get("round") != best
    )  # the keep never reached site A
    monkeypatch.setattr(faults, "reached", lambda point: None)
    carried = keeps_sent(grid)
    grid.sent = []
    serve(run, tmp_path / "flower", FlowerTransport(grid, run, nodes_timeout=1), progress=False)
    assert [c for c in carried if c[1] == "query.resume"] == [
        (name, "query.resume", best, best) for name in cfg["clients"]
    ]  # pooled: every site
    assert ("query.resume", best) in grid.sent and "query.setup" not in [kind for kind, _ in grid.sent]
    for name in OUTPUTS:
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "flower" / name, shallow=False), name


def test_a_keep_of_a_round_whose_end_the_site_is_not_at_is_refused(tmp_path, tiny_task, task_identity):
    """A keep names the round whose evaluated model to keep: a site whose state is not that round's
    end (here: after its final message) refuses in one line naming the step, site and round."""
    cfg, run, grid = start_run(tmp_path, tiny_task, rounds=1)
    transport = FlowerTransport(grid, run, nodes_timeout=1)
    serve(run, tmp_path / "flower", transport, progress=False)
    transport.pending_keep = {"B": 1}
    with pytest.raises(
        SiteError,
        match=r"^final: site B: the server asks it to keep its model of round 1, but its state at .*B\.pt is not at the end of that round; refused$",
    ):
        transport.final()
