"""Every bad case of a federation on Flower's deployment runtime ends in one line naming the site (and
round), with nothing half-written (fedmedbench.federation).

Most cases run through a fake ``Grid``: the ServerApp's ``FlowerTransport`` sends real Flower
``Message``s, which the ClientApp's own handlers (``clientapp.hello``, ``train``, ...) answer in this
process, each site with its node config and state folder; a ``tamper`` hook rewrites a reply as a
faulty or hostile site would. One slow test starts real processes (a SuperLink and SuperNodes) for
what only they show: a SuperNode started with a bad node config, and a SuperNode killed mid-run.
Skipped where the ``flower`` extra is not installed."""

import json
import math
import os
import signal
import threading
import time

import pytest
import torch

flwr = pytest.importorskip("flwr")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedmedbench.federation import clientapp  # noqa: E402
from fedmedbench.federation.messages import check_final, check_reply, check_same_shape, pack, unpack  # noqa: E402
from fedmedbench.federation.serverapp import FlowerTransport, read_run_config  # noqa: E402
from fedmedbench.fl.data import data_digest  # noqa: E402
from fedmedbench.fl.rounds import SiteError, run_rounds  # noqa: E402
from tests.conftest import tiny_run_config  # noqa: E402

HANDLERS = {
    "query.hello": clientapp.hello,
    "query.setup": clientapp.setup,
    "train": clientapp.train,
    "query.answer": clientapp.answer,
    "evaluate": clientapp.evaluate,
    "query.keep": clientapp.keep,
    "query.final": clientapp.final,
    "query.ood": clientapp.ood,
}


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower stamps a message with the process's run and task ids; a SuperNode sets them, here we do."""
    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, key, value)


class FakeGrid:
    """Node ``100 + i`` is site ``i`` of ``sites`` ({client: node config}); a message is answered by
    the ClientApp's handler in this process. ``tamper(message, reply) -> reply | None`` (None: no
    reply) plays a faulty site."""

    def __init__(self, tmp_path, sites: dict[str, dict], tamper=None):
        self.contexts = {}
        for i, (name, node_config) in enumerate(sites.items()):
            settings = {"client": name, "state-dir": str(tmp_path / f"site-{name}"), **node_config}
            self.contexts[100 + i] = Context(
                run_id=1, node_id=100 + i, node_config=settings, state=RecordDict(), run_config={}
            )
        self.tamper = tamper
        self.sent: list[str] = []

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for message in messages:
            self.sent.append(message.metadata.message_type)
            reply = HANDLERS[message.metadata.message_type](message, self.contexts[message.metadata.dst_node_id])
            if self.tamper is not None:
                reply = self.tamper(message, reply)
            if reply is not None:
                replies.append(reply)
        return replies


def site_of(grid: FakeGrid, message) -> str:
    return grid.contexts[message.metadata.dst_node_id].node_config["client"]


def rewrite(message, reply, change):
    """The reply with its payload passed through ``change(value) -> value`` (its config kept)."""
    value = change(unpack(reply.content, "test"))
    return Message(pack(value, **dict(reply.content["c"])), reply_to=message)


def setup_run(
    tmp_path, tiny_task, method="fedavg", rounds=2, node_config=None, tamper=None, expected=None, **overrides
):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, method, rounds=rounds, **overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    run = read_run_config(str(tmp_path / "run.json"))
    sites = {
        name: {"store": str(store), "split": str(split), **(node_config or {}).get(name, {})} for name in cfg["clients"]
    }
    grid = FakeGrid(tmp_path, sites, tamper)
    return run, grid, FlowerTransport(grid, run, nodes_timeout=1, expected_digests=expected)


def one_round(run, transport):
    """Round 1 of the run's method over ``transport`` (the server's side, as ``serve`` drives it)."""
    from fedmedbench.fl.seeding import seed_everything
    from fedmedbench.fl.selection import Selection
    from fedmedbench.models import build_model
    from fedmedbench.registry import load_method

    method = load_method(run.method, run.method_module)
    seed_everything(run.seed, torch.device("cpu"))
    server = method.Server(run, build_model(run.model), len(run.clients))
    per_client = {"auto": method.PERSONALIZED, "per_client": True, "pooled": False}[run.selection_scope]
    selection = Selection(list(run.clients), run.selection_metric, per_client=per_client)
    transport.start([server.package(i, 0) for i in range(len(run.clients))])
    run_rounds(run.replace(rounds=1), server, transport, list(run.clients), selection, [], 1)
    return transport.final()


# --- the checks, unit level ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, message",
    [
        ({"update": {"w": torch.tensor([1.0, float("inf")])}, "num_samples": 3}, "site A: tensor 'w' is not finite"),
        (
            {"update": {"w": torch.zeros(2, dtype=torch.float64)}, "num_samples": 3},
            r"tensor 'w' is \(2,\) torch.float64, the global model's is \(2,\) torch.float32",
        ),
        (
            {"state": {"w": torch.zeros(2)}, "num_samples": 3, "amplitude": torch.tensor([float("nan")])},
            "site A: tensor 'amplitude' is not finite",
        ),
        (
            {"state": {"w": torch.zeros(2)}, "num_samples": 3, "deputy": {"w": torch.tensor([0.0, float("nan")])}},
            "site A: tensor 'deputy.w' is not finite",
        ),
        ({"state": {"w": torch.zeros(2)}, "num_samples": True}, "site A: num_samples True is not a positive integer"),
        ({"state": {"w": [1.0, 2.0]}, "num_samples": 3}, "site A: 'state' is not a dict of named tensors"),
    ],
)
def test_replies_that_are_not_a_plain_state_are_checked_too(reply, message):
    reference = {"w": torch.zeros(2)}
    check_reply(
        "site A", {"update": {"w": torch.ones(2)}, "num_samples": 3, "steps": 2}, reference
    )  # CGSV's reply passes
    check_reply("site A", {"answer": torch.ones(3)}, None)  # no model, no reference: only finiteness
    with pytest.raises(SiteError, match=message):
        check_reply("site A", reply, reference)


def test_the_site_whose_reply_differs_in_shape_is_named():
    good = {"state": {"w": torch.zeros(2)}, "num_samples": 3, "steps": 1}
    check_same_shape("round 2 train", {"A": good, "B": {**good, "num_samples": 7}, "C": good})  # numbers may differ
    cases = [
        (
            {**good, "extra": 1},
            r"round 2 train: site B: its reply differs in shape from the other sites': the payload has extra key\(s\) \['extra'\]",
        ),
        ({"state": good["state"], "num_samples": 3}, r"site B: .*the payload has no key\(s\) \['steps'\]"),
        (
            {**good, "state": {"w": torch.zeros(3)}},
            r"site B: .*'state.w' is \(3,\) torch.float32, not \(2,\) torch.float32",
        ),
        ({**good, "steps": 1.0}, "site B: .*'steps' is a float, not a int"),
    ]
    for bad, message in cases:
        with pytest.raises(SiteError, match=message):
            check_same_shape("round 2 train", {"A": good, "B": bad, "C": good})
    with pytest.raises(SiteError, match=r"round 1 train: sites A and B send replies of different shapes"):
        check_same_shape("round 1 train", {"A": good, "B": {**good, "extra": 1}})


def test_a_final_reply_is_checked_and_withheld_parts_are_listed():
    reference = {"w": torch.zeros(2)}
    scores = {"dice": 0.5}
    full = {
        "test": scores,
        "flags": {},
        "counts": {},
        "model": {"w": torch.ones(2)},
        "predictions": {"pred": torch.zeros(1, 2)},
        "round": 2,
    }
    assert check_final("final: site A", full, reference, 3) == []
    assert check_final(
        "final: site A", {k: v for k, v in full.items() if k != "model"} | {"withheld": ["model"]}, reference, 3
    ) == ["model"]
    for bad, message in [
        (
            {k: v for k, v in full.items() if k != "model"},
            r"final: site A: the final reply has extra key\(s\) \[\] / lacks \['model'\]",
        ),
        ({**full, "withheld": ["test"]}, "'withheld' \\['test'\\] is not a list of"),
        ({**full, "round": 4}, r"kept round 4 is not a round of this run \(1..3\)"),
        ({**full, "model": {"w": torch.tensor([0.0, float("nan")])}}, "tensor 'w' is not finite"),
        ({**full, "test": {"dice": math.inf}}, "final: site A test: an infinite score"),
    ]:
        with pytest.raises(SiteError, match=message):
            check_final("final: site A", bad, reference, 3)


# --- through the fake grid: what the server refuses, naming the site --------------------------------
def test_every_reply_check_passes_the_real_replies_of_a_method_whose_reply_is_not_a_plain_state(tmp_path, tiny_task):
    # CGSV replies with an update (no "state"), Fed-LWR answers a query with pairwise scores naming
    # the other sites (answers differ in shape by design), HarmoFL adds an amplitude.
    for method in ("cgsv", "fedlwr", "harmofl"):
        run, grid, transport = setup_run(tmp_path / method, tiny_task, method, rounds=1)
        finals = one_round(run, transport)
        assert sorted(finals) == ["A", "B", "C"] and transport.withheld == {}
        assert all(0.0 <= f["test"]["dice_paper"] <= 1.0 for f in finals.values()), method
        assert ("query.answer" in grid.sent) == (method == "fedlwr")


def poison_site_b(step: str, change):
    def tamper(message, reply):
        if message.metadata.message_type == step and message.metadata.dst_node_id == 101:  # site B
            return rewrite(message, reply, change)
        return reply

    return tamper


def nan_state(value):
    key = next(iter(value["state"]))
    value["state"][key] = torch.full_like(value["state"][key], float("nan"))
    return value


@pytest.mark.parametrize(
    "step, change, message",
    [
        ("train", nan_state, r"round 1 train: site B: tensor '.*' is not finite \(NaN or inf\); refused"),
        (
            "train",
            lambda v: {**v, "state": {**v["state"], "extra.weight": torch.zeros(1)}},
            "round 1 train: site B: the reply holds tensor 'extra.weight', which the global model has not",
        ),
        (
            "train",
            lambda v: {k: x for k, x in v.items() if k != "steps"},
            r"round 1 train: site B: its reply differs in shape from the other sites': the payload has no key\(s\) \['steps'\]",
        ),
        (
            "train",
            lambda v: {**v, "state": {k: x.double() if x.is_floating_point() else x for k, x in v["state"].items()}},
            "round 1 train: site B: tensor '.*' is .* torch.float64, the global model's is .* torch.float32",
        ),
        (
            "train",
            lambda v: [1, 2],
            r"round 1 train: site B: the reply is not a model update \(a dict of named values, got list\)",
        ),
        (
            "evaluate",
            lambda v: {"val": v["val"]},
            r"round 1 evaluate: site B: the evaluation reply is not \{'val', 'test'\} \(got \['val'\]\)",
        ),
        (
            "evaluate",
            lambda v: {**v, "val": {**v["val"], "dice_paper": math.inf}},
            "round 1 evaluate: site B val: an infinite score",
        ),
        (
            "evaluate",
            lambda v: {**v, "val": {**v["val"], "extra_metric": 0.5}},
            r"round 1 evaluate: site B: .*extra key\(s\) \['extra_metric'\]",
        ),
        (
            "query.final",
            lambda v: {**v, "round": 7},
            r"final: site B: kept round 7 is not a round of this run \(1..1\)",
        ),
        (
            "query.final",
            lambda v: {**v, "secret": 1},
            r"final: site B: the final reply has extra key\(s\) \['secret'\]",
        ),
    ],
)
def test_a_bad_reply_is_refused_naming_the_site_and_round(tmp_path, tiny_task, step, change, message):
    run, grid, transport = setup_run(tmp_path, tiny_task, rounds=1, tamper=poison_site_b(step, change))
    with pytest.raises(SiteError, match=message) as caught:
        one_round(run, transport)
    assert "\n" not in str(caught.value)


def test_a_nan_answer_of_a_query_is_refused(tmp_path, tiny_task):
    def nan_answer(value):
        return (
            torch.full((2,), float("nan"))
            if isinstance(value, torch.Tensor)
            else {k: torch.full((1,), float("nan")) for k in ["x"]}
        )

    run, grid, transport = setup_run(
        tmp_path, tiny_task, "fedce", rounds=1, tamper=poison_site_b("query.answer", nan_answer)
    )
    with pytest.raises(SiteError, match=r"round 1 answer: site B: tensor '.*' is not finite"):
        one_round(run, transport)


@pytest.mark.parametrize(
    "reply, message",
    [
        (None, r"round 1 train: site B: no reply within 7.0 s \(the SuperNode stopped or lost its connection\)"),
        ("error5", r"round 1 train: site B: its SuperNode stopped sending heartbeats .* \(Flower error 5: node gone\)"),
        ("error8", r"round 1 train: site B: its ClientApp crashed \(Flower error 8: exit code -9\)"),
    ],
)
def test_a_lost_site_stops_the_run_naming_it_and_the_round(tmp_path, tiny_task, reply, message):
    def tamper(sent, answer):
        if sent.metadata.message_type != "train" or sent.metadata.dst_node_id != 101:
            return answer
        if reply is None:
            return None
        code = int(reply[-1])
        return Message(Error(code=code, reason={5: "node gone", 8: "exit code\n-9"}[code]), reply_to=sent)

    run, grid, transport = setup_run(tmp_path, tiny_task, rounds=1, tamper=tamper)
    transport.reply_timeout = 7.0
    with pytest.raises(SiteError, match=message):
        one_round(run, transport)


# --- hello: who a node is, what it reads, what it agreed to ------------------------------------------
def test_a_node_of_an_unknown_site_or_method_is_refused_at_hello(tmp_path, tiny_task):
    store, split = tiny_task
    with pytest.raises(
        SiteError,
        match=r"hello: site D: the run's clients are \['A', 'B', 'C'\]; this SuperNode's client is not one of them",
    ):
        setup_run(tmp_path / "d", tiny_task, node_config={"C": {"client": "D"}})
    # The run names a method this site's installation does not have (a plug-in not installed there).
    cfg = tiny_run_config(store, split, "fedavg", rounds=1)
    run = read_run_config_dict(tmp_path, cfg).replace(method="fedunknown")
    grid = FakeGrid(tmp_path / "m", {n: {"store": str(store), "split": str(split)} for n in cfg["clients"]})
    with pytest.raises(SiteError, match=r"hello: site A: \w+Error: .*fedunknown") as caught:
        FlowerTransport(grid, run, nodes_timeout=1)
    assert "\n" not in str(caught.value)


def read_run_config_dict(tmp_path, cfg):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    return read_run_config(str(tmp_path / "run.json"))


def test_a_site_whose_data_differs_from_the_runs_expectation_is_refused(tmp_path, tiny_task):
    store, split = tiny_task
    digests = {name: data_digest(store, split, [name]) for name in ("A", "B", "C")}
    assert len(set(digests.values())) == 3  # one per site
    _, _, transport = setup_run(tmp_path / "ok", tiny_task, expected=digests)
    assert transport.site_digests == digests  # recorded (federation.json)
    _, _, transport = setup_run(tmp_path / "none", tiny_task)  # no expectation: recorded only
    assert transport.site_digests == digests
    wrong = {**digests, "B": "0123456789abcdef"}
    with pytest.raises(
        SiteError, match=f"hello: site B: its data digest is {digests['B']}, the run expects 0123456789abcdef"
    ):
        setup_run(tmp_path / "bad", tiny_task, expected=wrong)


def test_a_site_pinned_to_another_run_config_or_holding_another_runs_state_refuses(tmp_path, tiny_task):
    with pytest.raises(
        SiteError,
        match="hello: site C: this SuperNode is approved for run config fingerprint 0000000000000000, the server sent [0-9a-f]{16}; refused",
    ):
        setup_run(tmp_path / "pin", tiny_task, node_config={"C": {"run-fingerprint": "0000000000000000"}})
    run, _, transport = setup_run(
        tmp_path / "ok",
        tiny_task,
        rounds=1,
        node_config={"C": {"run-fingerprint": run_fingerprint(tmp_path, tiny_task)}},
    )
    one_round(run, transport)  # the approved config runs
    transport.fingerprint = "feedfeedfeedfeed"  # the server now runs another config over the sites' state
    with pytest.raises(
        SiteError,
        match="round 2 train: site A: the server runs config fingerprint feedfeedfeedfeed, this site's state at .* was made for [0-9a-f]{16}; refused",
    ):
        transport.train(2)


def run_fingerprint(tmp_path, tiny_task):
    store, split = tiny_task
    return read_run_config_dict(tmp_path / "fp", tiny_run_config(store, split, "fedavg", rounds=1)).fingerprint()


def test_a_bad_share_setting_is_refused_at_hello(tmp_path, tiny_task):
    with pytest.raises(
        SiteError, match="hello: site B: SuperNode node config: share-model='maybe' is not true or false"
    ):
        setup_run(tmp_path, tiny_task, node_config={"B": {"share-model": "maybe"}})


# --- a site's opt-out -----------------------------------------------------------------------------
def test_a_site_may_withhold_its_model_and_predictions_and_the_tables_still_read_the_run(tmp_path, tiny_task):
    from fedmedbench.fl import checkpoint
    from fedmedbench.fl.engine import run_training
    from fedmedbench.fl.rounds import serve

    node_config = {"B": {"share-model": False}, "C": {"share-predictions": "false"}}
    sent_up = {}

    def record(message, reply):  # what each site's final reply carried up
        if message.metadata.message_type == "query.final":
            sent_up[message.metadata.dst_node_id] = set(unpack(reply.content, "test"))
        return reply

    run, grid, transport = setup_run(tmp_path, tiny_task, rounds=2, node_config=node_config, tamper=record)
    final = serve(run, tmp_path / "fed", transport, progress=False)
    assert transport.withheld == {"B": ["model"], "C": ["predictions"]}
    # The scores are all there, and equal the engine's: withholding changes what goes up, not the run.
    store, split = tiny_task
    engine = run_training(
        tiny_run_config(store, split, "fedavg", rounds=2), tmp_path / "engine", threads=1, progress=False
    )
    assert final["test"] == engine["test"] and final["val"] == engine["val"]
    saved = checkpoint.load_plain(tmp_path / "fed" / "model_best.pt")
    assert saved["withheld"] == ["B"] and saved["clients"] == ["A", "B", "C"]
    assert saved["models"]["base_client"] == "A" and set(saved["models"]["diffs"]) == {"C"}
    import numpy as np

    with (
        np.load(tmp_path / "fed" / "predictions.npz") as predictions,
        np.load(tmp_path / "engine" / "predictions.npz") as full,
    ):
        assert sorted({k.split("|")[0] for k in predictions.files}) == ["A", "B"]
        for key in predictions.files:
            assert np.array_equal(predictions[key], full[key]), key
    # What a site keeps never leaves it: B's final reply held no model, C's no predictions.
    assert "model" in sent_up[100] and "predictions" in sent_up[100]
    assert "model" not in sent_up[101] and "predictions" in sent_up[101] and sent_up[101] >= {"test", "withheld"}
    assert "predictions" not in sent_up[102] and "model" in sent_up[102]


# --- a test-only cohort (ood_clients) ----------------------------------------------------------------
def cohort_run(tmp_path, tiny_task, node_config=None, tamper=None, rounds=2, **overrides):
    """PRR-FL on sites A and B with site C's SuperNode as the run's test-only cohort (its test rows)."""
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "prrfl", rounds=rounds, clients=["A", "B"], ood_clients=["C"], **overrides)
    run = read_run_config_dict(tmp_path, cfg)
    sites = {
        name: {"store": str(store), "split": str(split), **(node_config or {}).get(name, {})}
        for name in ("A", "B", "C")
    }
    grid = FakeGrid(tmp_path, sites, tamper)
    return cfg, run, grid, FlowerTransport(grid, run, nodes_timeout=1)


def test_a_test_only_cohort_scores_the_sites_models_as_the_engine(tmp_path, tiny_task):
    """The cohort's node is sent hello, then nothing until ``ood`` (after the final message); the run
    folder equals the engine's byte for byte, final.json's ood part included."""
    import filecmp

    from fedmedbench.fl.engine import run_training
    from fedmedbench.fl.rounds import serve

    cfg, run, grid, transport = cohort_run(tmp_path, tiny_task)
    assert transport.node == {"A": 100, "B": 101} and transport.cohort_node == {"C": 102}
    grid.sent.clear()
    sent_to = []
    grid.tamper = lambda message, reply: (
        sent_to.append((message.metadata.message_type, message.metadata.dst_node_id)) or reply
    )
    serve(run, tmp_path / "fed", transport, progress=False)
    assert [kind for kind, node in sent_to if node == 102] == ["query.ood"] and sent_to[-1] == ("query.ood", 102)
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    for output in ("final.json", "history.csv", "model_best.pt", "predictions.npz"):
        assert filecmp.cmp(tmp_path / "engine" / output, tmp_path / "fed" / output, shallow=False), output
    ood = json.loads((tmp_path / "fed" / "final.json").read_text())["ood"]
    assert list(ood) == ["C"] and sorted(ood["C"]["per_model"]) == ["A", "B"]


def test_a_site_that_withholds_its_model_from_a_run_with_a_cohort_is_refused_at_hello(tmp_path, tiny_task):
    with pytest.raises(
        SiteError,
        match=r"hello: site B keeps its model to itself \(share-model=false\), so test-only cohort\(s\) C cannot score it; .*; refused",
    ):
        cohort_run(tmp_path, tiny_task, node_config={"B": {"share-model": False}})
    cohort_run(
        tmp_path / "predictions", tiny_task, node_config={"B": {"share-predictions": False}}
    )  # its predictions only: served


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda v: {**v, "per_model": {"A": v["per_model"]["A"]}},
            r"ood: cohort C: per_model scores sites \['A'\], the run's sites are \['A', 'B'\]; refused",
        ),
        (
            lambda v: {**v, "ensemble": {**v["ensemble"], "f1": math.inf}},
            r"ood: cohort C ensemble: an infinite score; refused",
        ),
        (lambda v: {"mean": v["mean"]}, r"ood: cohort C: the reply is not \['ensemble', 'mean', 'per_model'\]"),
    ],
    ids=["a-site-missing", "infinite", "keys"],
)
def test_a_bad_cohort_reply_is_refused_naming_the_cohort(tmp_path, tiny_task, change, message):
    from fedmedbench.fl.rounds import serve

    def tamper(sent, reply):
        return rewrite(sent, reply, change) if sent.metadata.message_type == "query.ood" else reply

    _, run, _, transport = cohort_run(tmp_path, tiny_task, tamper=tamper, rounds=1)
    with pytest.raises(SiteError, match=message):
        serve(run, tmp_path / "fed", transport, progress=False)
    assert not (tmp_path / "fed" / "final.json").exists()


def test_a_cohort_node_is_not_taken_for_a_training_site(tmp_path, tiny_task):
    """Site C's SuperNode in a run where C trains answers as a training site; where C is the cohort,
    a node that answers as a training site (another version, a tampered reply) is refused."""

    def tamper(sent, reply):
        if sent.metadata.message_type == "query.hello" and sent.metadata.dst_node_id == 102:
            return rewrite(sent, reply, lambda v: {k: w for k, w in v.items() if k != "test_only"})
        return reply

    with pytest.raises(
        SiteError,
        match="hello: site C: it is a test-only cohort of run prrfl, but its SuperNode answered as a training site; refused",
    ):
        cohort_run(tmp_path, tiny_task, tamper=tamper)


# --- a real federation: a bad node config, then a killed SuperNode ------------------------------------
@pytest.mark.slow
@pytest.mark.federation
def test_a_real_federation_stops_in_one_line_on_a_bad_node_and_on_a_killed_supernode(tmp_path, tiny_task):
    from fedmedbench.federation.local import _stop, local_federation

    started = time.monotonic()
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=2)
    (tmp_path / "run.json").write_text(json.dumps(cfg))
    good = {"store": str(store), "split": str(split)}
    sites = {"A": good, "B": good, "C": {**good, "share-model": "maybe"}}
    outputs = ("final.json", "history.csv", "model_best.pt", "predictions.npz", "federation.json")
    with local_federation(sites, tmp_path / "federation", warm=True) as federation:
        # 1. Site C's SuperNode was started with a bad node config: refused at hello, naming it.
        out1 = tmp_path / "run1"
        result = federation.run(
            {"run-config": str(tmp_path / "run.json"), "out": str(out1), "nodes-timeout": 240}, timeout=300
        )
        text = result.stdout + result.stderr
        assert "hello: site C: SuperNode node config: share-model='maybe' is not true or false" in text, text[-3000:]
        assert not any((out1 / name).exists() for name in outputs)
        # 2. C restarted with a good config (SIGTERM: it leaves the federation at once); then B's
        # SuperNode is killed (SIGKILL: no goodbye) once the run is set up on it.
        node_c = federation.supernode("C")
        _stop(node_c)
        federation.start_supernode("C", good)
        out2 = tmp_path / "run2"
        outcome = {}
        runner = threading.Thread(
            target=lambda: outcome.update(
                result=federation.run(
                    {
                        "run-config": str(tmp_path / "run.json"),
                        "out": str(out2),
                        "nodes-timeout": 240,
                        "reply-timeout": 40,
                    },
                    timeout=300,
                )
            )
        )
        runner.start()
        # Site B has sent 3 replies (run 1's hello, run 2's hello and setup): the run is set up on it.
        log_b = tmp_path / "federation" / "supernode-B.log"
        deadline = time.monotonic() + 280  # seconds on an idle machine
        while log_b.read_text().count("Sent successfully") < 3 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log_b.read_text().count("Sent successfully") >= 3, f"the run was not set up on site B: {outcome}"
        node_b = federation.supernode("B")
        os.killpg(node_b.pid, signal.SIGKILL)
        runner.join(320)
        assert "result" in outcome, "flwr run did not return within 300 s"
        result = outcome["result"]
    text = result.stdout + result.stderr
    assert "round 1 train: site B: no reply within 40.0 s (the SuperNode stopped or lost its connection)" in text, text[
        -3000:
    ]
    assert not any((out2 / name).exists() for name in outputs)
    print(
        f"real federation faults: {time.monotonic() - started:.0f} s, flwr run exit {result.returncode}\n{text[-2500:]}"
    )


def test_the_qualitative_figure_leaves_out_a_site_that_withheld_its_predictions(tmp_path, caplog):
    import numpy as np

    from fedmedbench.report.qualitative import load_rows

    files = {}
    for run, sites in (("engine", ("X", "Y")), ("flower", ("X",))):  # the federated run's site Y withheld them
        arrays = {
            f"{c}|{k}": np.full((2, 8, 8) + ((3,) if k == "image" else ()), 1, np.uint8)
            for c in sites
            for k in ("image", "label", "pred")
        }
        files[run] = tmp_path / f"{run}.npz"
        np.savez(files[run], **arrays)
    with caplog.at_level("WARNING", logger="fedmedbench.report"):
        rows = load_rows(files, "prostate", ["X", "Y"], per_client=2)
    assert [row["label"] for row in rows] == ["prostate / X"] * 2 and sorted(rows[0]["preds"]) == ["engine", "flower"]
    assert "flower has no predictions of site Y (withheld by the site)" in caplog.text
