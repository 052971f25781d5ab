"""The generic ServerApp: any method's ``Server`` over Flower's ``Grid``, with the engine's round loop
(``fedmedbench.fl.rounds.run_rounds``) and the engine's outputs.

Run config (``flwr run ... --run-config``): ``run-config`` (a resolved run config as JSON, what
Snakemake passes to ``fedmedbench train``; its data paths are not opened here: the server opens no
store), ``out`` (the run folder: history.csv, final.json, model_best.pt, predictions.npz, written
as the engine writes them), ``nodes-timeout`` (seconds to wait for every site's SuperNode) and
``reply-timeout`` (seconds a round waits for the sites' replies; 0: no limit). Checkpoints:
``checkpoint-every`` (rounds, default 1), ``checkpoint-every-seconds`` (default 0) and ``resume``
(default true: a restarted server continues after the run folder's checkpoint, the sites going back
to their state of that round; false: start afresh); ``kill-at`` is a test hook (``faults.py``:
e.g. ``round_end:2`` kills this server after round 2's checkpoint).

One writer per run folder: the ServerApp holds ``out``'s run lock (``fl/runlock.py``, as ``train``
does) while it runs, so a second run into the same folder (an operator's retry beside a queued
``flwr run`` that started by itself) is refused in one line naming both Flower run ids. A finished
run folder (``final.json``) is left as it is unless the run config says ``restart=true``.
``lock-owner``: the pid of ``federation local``, which holds the lock for the ServerApp it starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedmedbench import faults
from fedmedbench.errors import MethodError
from fedmedbench.federation.messages import (
    check_evaluation,
    check_final,
    check_finite_payload,
    check_ood,
    check_reply,
    check_same_shape,
    pack,
    unpack,
)
from fedmedbench.files import atomic_write_text
from fedmedbench.fl.rounds import SiteError, serve
from fedmedbench.fl.runlock import RunFolderBusy, run_folder_lock
from fedmedbench.registry import merge_params
from fedmedbench.runconfig import RunConfig

app = ServerApp()


# Flower's error codes (flwr.common.constant.ErrorCode) as what they mean for the run.
FLOWER_ERRORS = {
    1: "its ClientApp could not be loaded (is fedmedbench with the flower extra installed on the site?)",
    2: "its ClientApp raised an exception",
    3: "the message expired before the SuperNode took it",
    4: "the reply expired before it arrived",
    5: "its SuperNode stopped sending heartbeats (killed, or cut off for over 2 heartbeat intervals); the run stops",
    8: "its ClientApp crashed",
}


def payload_bytes(records) -> int:
    """The bytes a message's records hold (tensors, metrics, configs), each record as Flower counts it."""
    return sum(record.count_bytes() for record in records.values())


def send_and_receive(
    grid: Grid, messages: list, timeout: float | None, first_wait: float = 0.05, longest_wait: float = 0.1
) -> list:
    """``Grid.send_and_receive`` with a shorter wait between pulls: Flower's waits 3 s after every
    pull without all replies (flwr/superlink/grid/http_grid.py), so every step of a round cost up
    to 3 s more than its ClientApps took. Here the wait starts at ``first_wait`` and grows by half
    each pull up to ``longest_wait``: a step's last reply is seen within 0.1 s, for ten cheap pulls a
    second (with 0.5 s, the average half of it was paid twice a round: benchmarks/bench_federation.py's
    "our ServerApp's reply polling" row measures it)."""
    if not hasattr(grid, "pull_messages"):  # a Grid-like object with send_and_receive only (a test's fake)
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = set(grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies, wait = [], first_wait
    while pending:
        got = list(grid.pull_messages(pending))
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if not pending or (deadline is not None and time.monotonic() >= deadline):
            break
        time.sleep(wait)
        wait = min(wait * 1.5, longest_wait)
    return replies


class FlowerTransport:
    """The sites behind the SuperNodes of ``grid``: one message per site and step, in client order;
    ``keep`` sends nothing of its own: it rides on the site's next message (``pending_keep``).
    A test-only cohort (``ood_clients``) is a SuperNode of its own: it answers ``hello``, then only
    ``ood`` after the final message (every site's selected model, to score on its test rows)."""

    def __init__(
        self,
        grid: Grid,
        cfg,
        nodes_timeout: float = 300.0,
        reply_timeout: float | None = None,
        expected_digests: dict[str, str] | None = None,
    ):
        self.grid, self.cfg, self.reply_timeout = grid, cfg, reply_timeout
        # hello, setup and resume start every site's ClientApp and open its data (seconds to minutes on
        # a busy machine): they wait as long as the sites' connection may take, not a step's bound.
        self.nodes_timeout = nodes_timeout
        # {site: data digest} the run expects (optional): a site whose store or split differs is refused.
        self.expected_digests = dict(expected_digests or {})
        self.site_digests: dict[str, str] = {}  # what each site said in hello (federation.json records it)
        self.withheld: dict[str, list[str]] = {}  # {site: ["model", "predictions"]} a site kept to itself
        self.names = list(cfg.clients)
        self.cohort_names = list(cfg.ood_clients)
        self.cohort_node: dict[str, int] = {}  # {cohort: node id}
        self.cfg_json = json.dumps(cfg.to_dict(), sort_keys=True)
        # Rides on every message: a site whose stored state was made for another run config refuses.
        self.fingerprint = cfg.fingerprint()
        self.reference = None  # the global model's state: the shape of a valid reply
        self.snapshot_round = -1  # a checkpointed round the sites have not been told of yet (serve's resume)
        # {site: round} whose evaluated model the site is to keep, said on its next message (train or
        # final): Flower 1.42's SuperNode sleeps ~3 s when idle, so a message of its own cost seconds.
        self.pending_keep: dict[str, int] = {}
        self.bytes_sent = self.bytes_received = 0  # payload bytes (records), each way
        self.messages_sent = 0  # Flower messages pushed (federation.json)
        self.out = None  # the run folder (main sets it): the counts of each checkpointed round go there
        self.resumed_after: list[int] = []  # rounds after which this run was resumed (federation.json)
        self.node = self._find_sites(nodes_timeout)

    # --- messaging ------------------------------------------------------------------------------
    def _exchange(
        self,
        message_type: str,
        payloads: dict[int, object],
        step: str,
        wait: float | None = None,
        per_node: dict[int, dict] | None = None,
        **config,
    ) -> dict[int, tuple[object, dict]]:
        """Send ``payloads[node]`` to each node; {node: (payload, reply config)}, or one error line
        naming the site and step for a missing, failed or malformed reply. ``wait``: seconds to wait
        for the replies (default ``reply_timeout``; getting the sites ready waits ``nodes_timeout``).
        ``per_node``: config entries for one node only (e.g. its pending ``keep``), beside ``config``."""
        wait = self.reply_timeout if wait is None else wait
        per_node = per_node or {}
        messages = [
            Message(
                pack(value, fingerprint=self.fingerprint, **config, **per_node.get(node, {})),
                node,
                message_type,
                group_id=step,
            )
            for node, value in payloads.items()
        ]
        self.bytes_sent += sum(payload_bytes(m.content) for m in messages)
        self.messages_sent += len(messages)
        received = send_and_receive(self.grid, messages, wait)
        # A reply is filed by the message it answers, not by its source: the SuperLink answers for a
        # node it has lost (Flower's "node unavailable" error) under its own node id.
        node_of_message = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
        replies = {node_of_message.get(m.metadata.reply_to_message_id, m.metadata.src_node_id): m for m in received}
        site_of = {node: name for name, node in [*getattr(self, "node", {}).items(), *self.cohort_node.items()]}
        # Every silent site is named, not only the first in client order: a slow site beside a dead
        # one must not hide the dead one from the site's IT team.
        silent = [site_of.get(node, f"node {node}") for node in payloads if node not in replies]
        if silent:
            within = f"within {wait} s" if wait is not None else "before the SuperLink gave up on it"
            raise SiteError(
                f"{step}: site {', '.join(silent)}: no reply {within} (the SuperNode stopped or lost its connection)"
            )
        out = {}
        for node in payloads:
            where = f"{step}: site {site_of.get(node, f'node {node}')}"
            message = replies[node]
            if message.has_error():
                meaning = FLOWER_ERRORS.get(message.error.code, "Flower reported an error")
                reason = " ".join(str(message.error.reason).split())[:300]  # one line, whatever the traceback
                raise SiteError(f"{where}: {meaning} (Flower error {message.error.code}: {reason})")
            if "error" in message.content:
                error = message.content["error"]
                if error.get("method"):  # a method's hook failed: the same line as in the engine
                    raise MethodError(error["text"])
                raise SiteError(f"{step}: {error['text']}")
            self.bytes_received += payload_bytes(message.content)
            out[node] = (unpack(message.content, where), dict(message.content["c"]))
        return out

    def _find_sites(self, timeout: float) -> dict[str, int]:
        """Wait for one SuperNode per client, ask each which site it is: {client: node id}."""
        deadline = time.monotonic() + timeout
        members = [*self.names, *self.cohort_names]
        while len(list(self.grid.get_node_ids())) < len(members):
            if time.monotonic() > deadline:
                needs = "one per client" + (" and test-only cohort" if self.cohort_names else "")
                raise SiteError(
                    f"{len(list(self.grid.get_node_ids()))} SuperNode(s) connected within {timeout:.0f} s; the run needs {needs}: {', '.join(members)}"
                )
            time.sleep(0.5)
        nodes = sorted(self.grid.get_node_ids())
        # The expected digests ride along: a site whose data differs refuses itself, in its own log too.
        hello = self._exchange(
            "query.hello",
            {node: None for node in nodes},
            "hello",
            wait=self.nodes_timeout,
            cfg=self.cfg_json,
            digests=json.dumps(self.expected_digests),
        )
        node_of, rows = {}, {}
        for node, (value, _) in hello.items():
            if (
                not isinstance(value, dict)
                or not isinstance(value.get("client"), str)
                or type(value.get("train_rows")) is not int
                or value["train_rows"] < 0
            ):
                raise SiteError(
                    f"hello: SuperNode {node} answered {value!r:.200}, not {{'client', 'train_rows', 'data_digest'}} (another app, or another fedmedbench version?)"
                )
            name = value["client"]
            if name in node_of or name in self.cohort_node:
                raise SiteError(
                    f"hello: two SuperNodes (ids {node_of.get(name, self.cohort_node.get(name))} and {node}) say they are site {name}"
                )
            if name not in self.names and name not in self.cohort_names:
                raise SiteError(
                    f"hello: SuperNode {node} is site {name}, which is not a client of run {self.cfg.run} ({', '.join(self.names)})"
                )
            if (name in self.cohort_names) != bool(value.get("test_only")):
                role = "a test-only cohort" if name in self.cohort_names else "a client"
                raise SiteError(
                    f"hello: site {name}: it is {role} of run {self.cfg.run}, but its SuperNode answered as {'a cohort' if value.get('test_only') else 'a training site'}; refused"
                )
            if name in self.cohort_names:
                self.cohort_node[name] = node
            else:
                node_of[name], rows[name] = node, int(value["train_rows"])
            digest = value.get("data_digest")
            if name in self.expected_digests and digest != self.expected_digests[name]:
                raise SiteError(
                    f"hello: site {name}: its data digest is {digest}, the run expects {self.expected_digests[name]} (another store or split than the run was planned on); refused"
                )
            self.site_digests[name] = digest
            if value.get("fingerprint") != self.fingerprint:  # the site's fedmedbench reads the config otherwise
                raise SiteError(
                    f"hello: site {name}: it reads the run config as fingerprint {value.get('fingerprint')}, the server as {self.fingerprint} (another fedmedbench version on the site?); refused"
                )
        missing = [n for n in self.names if n not in node_of] + [
            n for n in self.cohort_names if n not in self.cohort_node
        ]
        if missing:
            raise SiteError(f"hello: no SuperNode serves site(s) {', '.join(missing)}")
        # A cohort scores every site's selected model (the engine's ood_test: per model, mean,
        # ensemble): a site keeping its model to itself makes those numbers impossible. Refused now,
        # before anyone trains, not after the last round.
        for name in self.names:
            kept_here = hello[node_of[name]][0].get("withheld", [])
            if self.cohort_names and "model" in kept_here:
                raise SiteError(
                    f"hello: site {name} keeps its model to itself (share-model=false), so test-only cohort(s) {', '.join(self.cohort_names)} "
                    f"cannot score it; share it (share-model=true on site {name}) or run without ood_clients; refused"
                )
        self.train_rows = min(rows.values()) if self.cfg.truncate_to_smallest else -1
        return node_of

    def _by_site(self, results: dict[int, tuple]) -> list[tuple]:
        return [results[self.node[name]] for name in self.names]

    # --- the transport ------------------------------------------------------------------------
    def start(self, packages):
        if self.out is not None:  # a fresh start: an earlier run's counts are not this one's
            traffic_file(self.out).unlink(missing_ok=True)
        self.reference = packages[0]["state"] if isinstance(packages[0], dict) and "state" in packages[0] else None
        self._exchange(
            "query.setup",
            dict(zip(self._nodes(), packages)),
            "setup",
            wait=self.nodes_timeout,
            cfg=self.cfg_json,
            train_rows=self.train_rows,
        )

    # --- resume (transport.serve): the sites keep their own state of the checkpointed rounds ---------
    def snapshot(self, round_index):
        """The server checkpointed ``round_index``: said on the next message (no extra round trip);
        until then each site's state file is still that round's end (clientapp.take_snapshot)."""
        self.snapshot_round = round_index
        if self.out is not None:  # the counts so far, for a resumed run's federation.json
            path = traffic_file(self.out)
            saved = json.loads(path.read_text()) if path.is_file() else {}
            saved = {
                k: v for k, v in saved.items() if k.isdigit() and int(k) < round_index
            }  # the checkpoint's .prev stays
            keep = sorted(saved, key=int)[-2:]
            saved = {
                **{k: saved[k] for k in keep},
                str(round_index): {
                    "counts": {key: getattr(self, key) for key in TRAFFIC},
                    "resumed_after": self.resumed_after,
                },
            }
            atomic_write_text(path, json.dumps(saved))

    def resume(self, round_index, packages, kept=None):
        """A restarted server: every site goes back to its state at the end of ``round_index``; a site
        that cannot is refused in one line naming it and the round. ``packages``: the round-0
        packages, for the shape of a valid reply only (nothing is sent). ``kept``: {site: the round
        its restored selection kept}; a site kept at ``round_index`` itself is told so (``keep``):
        that keep rode on a message the dead server never sent, so its state file at that round's
        end may lack it (a snapshot of the round always has it)."""
        self.reference = packages[0]["state"] if isinstance(packages[0], dict) and "state" in packages[0] else None
        self.pending_keep = {}
        # federation.json counts the whole run: what was sent up to the checkpoint, then this server's.
        path = traffic_file(self.out) if self.out is not None else None
        saved = (
            (json.loads(path.read_text()) if path.is_file() else {}).get(str(round_index)) if path is not None else None
        )
        if saved:
            for key in TRAFFIC:
                setattr(self, key, getattr(self, key) + int(saved["counts"][key]))
            self.resumed_after = [*saved["resumed_after"]]
        self.resumed_after.append(round_index)
        covered = {
            self.node[name]: {"keep": round_index}
            for name, kept_round in (kept or {}).items()
            if kept_round == round_index
        }
        self._exchange(
            "query.resume",
            {node: None for node in self._nodes()},
            f"resume after round {round_index}",
            wait=self.nodes_timeout,
            per_node=covered,
            round=round_index,
            cfg=self.cfg_json,
        )

    def data_fingerprint(self):
        """What the sites read (each one's data digest from hello, in client order), for the checkpoint:
        a checkpoint of data rebuilt since on any site is not resumed."""
        # The cohorts' digests after the clients' (a run without cohorts digests what it did before).
        return hashlib.sha256(
            json.dumps([self.site_digests.get(name) for name in [*self.names, *self.cohort_names]]).encode()
        ).hexdigest()[:16]

    def _nodes(self):
        return [self.node[name] for name in self.names]

    def _take_keeps(self) -> dict[int, dict]:
        """The pending keeps as per-node config (``keep=<round>``), cleared: they ride on this message."""
        keeps, self.pending_keep = self.pending_keep, {}
        return {self.node[name]: {"keep": round_index} for name, round_index in keeps.items()}

    def train(self, round_index):
        # A checkpoint since the last message rides on this one: each site first snapshots its state, still that round's end.
        # So does a keep of the last round: each covered site keeps its evaluated model first, then
        # snapshots (a snapshot of a round is that round's full end, its kept model included).
        snapshot, self.snapshot_round = self.snapshot_round, -1
        results = self._by_site(
            self._exchange(
                "train",
                {node: None for node in self._nodes()},
                f"round {round_index} train",
                per_node=self._take_keeps(),
                round=round_index,
                snapshot=snapshot,
            )
        )
        out = []
        for name, (reply, config) in zip(self.names, results):
            check_reply(f"round {round_index} train: site {name}", reply, self.reference)
            try:
                loss, rows = float(config["loss"]), json.loads(config["rows"])
            except (KeyError, TypeError, ValueError):
                raise SiteError(
                    f"round {round_index} train: site {name}: the reply carries no training loss and history rows; refused"
                ) from None
            if not math.isfinite(loss):
                raise SiteError(f"round {round_index} train: site {name}: training loss {loss} is not finite; refused")
            out.append((reply, loss, rows))
        check_same_shape(f"round {round_index} train", {name: reply for name, (reply, _, _) in zip(self.names, out)})
        return out

    def answer(self, round_index, queries):
        results = self._exchange(
            "query.answer", dict(zip(self._nodes(), queries)), f"round {round_index} answer", round=round_index
        )
        answers = [value for value, _ in self._by_site(results)]
        # Finite, but not one shape: each site answers its own query (Fed-LWR's pairwise scores name
        # the other sites).
        for name, value in zip(self.names, answers):
            check_finite_payload(f"round {round_index} answer: site {name}", value)
        return answers

    def evaluate(self, round_index, packages, with_test):
        results = self._exchange(
            "evaluate",
            dict(zip(self._nodes(), packages)),
            f"round {round_index} evaluate",
            round=round_index,
            with_test=with_test,
        )
        out = []
        for name, (value, _) in zip(self.names, self._by_site(results)):
            check_evaluation(f"round {round_index} evaluate: site {name}", value, with_test)
            out.append((value["val"], value["test"]))
        check_same_shape(
            f"round {round_index} evaluate",
            {name: {"val": val, "test": test} for name, (val, test) in zip(self.names, out)},
        )
        return out

    def keep(self, round_index, names):
        """Nothing is sent now: each covered site keeps its evaluated model of ``round_index`` when its
        next message (the next round's train, or final) arrives, before that message's own step."""
        for name in names:
            self.pending_keep[name] = round_index
        return {n: ({}, {}) for n in names}  # the models stay on the sites until the final message

    def final(self):
        results = self._exchange(
            "query.final", {node: None for node in self._nodes()}, "final", per_node=self._take_keeps()
        )
        out = {}
        for name, (value, _) in zip(self.names, self._by_site(results)):
            withheld = check_final(f"final: site {name}", value, self.reference, self.cfg.rounds)
            if withheld:  # the site's node config keeps them there: the run folder notes it
                self.withheld[name] = withheld
            out[name] = {**value, "model": value.get("model"), "predictions": value.get("predictions", {})}
        check_same_shape("final", {name: value["test"] for name, value in out.items()})
        check_finite_payload(
            "final", {name: value["model"] for name, value in out.items() if value["model"] is not None}
        )
        return out

    def ood(self, models):
        """Every cohort scores ``models`` ({site: selected model}, client order) on its own test rows:
        {cohort: {"mean", "ensemble", "per_model"}} (the cohorts in ``ood_clients`` order)."""
        nodes = {self.cohort_node[name]: {"models": models} for name in self.cohort_names}
        results = self._exchange("query.ood", nodes, "ood", cfg=self.cfg_json)
        out = {}
        for name in self.cohort_names:
            value = results[self.cohort_node[name]][0]
            check_ood(f"ood: cohort {name}", value, self.names)
            out[name] = value
        return out


def read_run_config(path: str):
    cfg = RunConfig.from_dict(json.loads(Path(path).read_text()), where=path)
    return cfg.replace(
        method_params=merge_params(
            cfg.method, cfg.method_params, f"run config {path}: method_params", cfg.method_module
        )
    )


def show_progress() -> None:
    """The run's own lines (one per round, "resuming from round k") on the ServerApp's output, which
    Flower mirrors to ``flwr run --stream``: Flower configures only its own logger, so without a
    handler of ours the terminal stayed silent for the whole run. Not where a handler exists already
    (the simulation route runs this ServerApp inside a job that logs)."""
    log = logging.getLogger("fedmedbench")
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def finished_by(out: Path) -> str:
    """Who finished run folder ``out``: "Flower run <id>" (its federation.json), else "another run"."""
    try:
        run_id = json.loads((out / "federation.json").read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        run_id = None
    return f"Flower run {run_id}" if run_id is not None else "another run (no Flower run id in federation.json)"


# What a finished run folder holds; restart=true removes them first (final.json first: it marks the
# folder complete), so an interrupted restart never leaves the old run's final.json beside new files.
FINISHED_OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz", "federation.json")


def claim(out: Path, run_id: int, restart: bool) -> None:
    """Under the run lock: a finished run folder is another run's result and stays as it is, unless
    ``restart``; then its outputs go before anything is trained."""
    if (out / "final.json").is_file():
        if not restart:
            raise RunFolderBusy(
                f"{out}: {finished_by(out)} finished this run folder (final.json); Flower run {run_id} leaves it as it is: "
                "give another out, or restart=true in --run-config to train it again"
            )
        for name in FINISHED_OUTPUTS:
            (out / name).unlink(missing_ok=True)


TRAFFIC = ("bytes_sent", "bytes_received", "messages_sent")


def traffic_file(out: Path) -> Path:
    """The transport's counts at each checkpointed round (``FlowerTransport.snapshot``), so a resumed
    run's federation.json counts the whole run; removed once federation.json is written."""
    return out / "federation-traffic.json"


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = context.run_config
    show_progress()
    out = Path(str(settings["out"]))
    out.mkdir(parents=True, exist_ok=True)
    restart = bool(settings.get("restart", False))
    owner = int(settings.get("lock-owner", 0)) or None
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(run_folder_lock(out, holder=f"Flower run {context.run_id} (ServerApp)", owner=owner))
        except RunFolderBusy as err:  # the holder's line names its run id; this one adds ours
            raise RunFolderBusy(f"Flower run {context.run_id}: {err}") from None
        claim(out, context.run_id, restart)
        run(grid, context, settings, out, resume=bool(settings.get("resume", True)) and not restart)


def run(grid: Grid, context: Context, settings, out: Path, resume: bool) -> None:
    """The run itself, under ``out``'s lock."""
    # The server's own arithmetic (aggregation, CGSV's reputations, FedCE's coefficients) on as many
    # CPU threads as the engine run it should equal (`train --threads`; the sites: node setting
    # `threads`): torch's default, one per core, sums in another order (the last digits differ).
    torch.set_num_threads(int(settings.get("threads", 1)))
    cfg = read_run_config(str(settings["run-config"]))
    reply_timeout = float(settings.get("reply-timeout", 0)) or None
    expected = json.loads(str(settings.get("site-digests", "") or "{}"))  # {site: data digest}, optional
    transport = FlowerTransport(grid, cfg, float(settings.get("nodes-timeout", 300)), reply_timeout, expected)
    transport.out = out
    if str(settings.get("kill-at", "")):  # a test hook: the engine's FEDMEDBENCH_KILL_AT (faults.py) for this server
        os.environ[faults.KILL_AT_ENV] = str(settings["kill-at"])
    serve(cfg, out, transport, progress=True, checkpoint_every=int(settings.get("checkpoint-every", 1)),
          checkpoint_every_seconds=float(settings.get("checkpoint-every-seconds", 0)), resume=resume)  # fmt: skip
    traffic = {**{key: getattr(transport, key) for key in TRAFFIC}, "rounds": cfg.rounds, "sites": len(transport.names),
               # what each site reads (its data digest, as the engine's checkpoints digest it) and what a
               # site kept to itself (node config share-model / share-predictions = false)
               "data_digests": transport.site_digests, "withheld": transport.withheld,
               # the Flower run that finished this folder (a later run into it names it), and the
               # rounds after which a restarted server resumed (the counts above are the whole run's)
               "run_id": context.run_id, "resumed_after": transport.resumed_after}  # fmt: skip
    (out / "federation.json").write_text(json.dumps(traffic, indent=2) + "\n")
    traffic_file(out).unlink(missing_ok=True)
