"""The generic ClientApp: any method's ``Client`` on the SuperNode's own site.

The SuperNode's node config names the site and its data, e.g.::

    flower-supernode ... --node-config 'store="/data/store" split="/data/split.csv" client="BIDMC"'

optionally ``state-dir="/var/lib/fedmedbench"`` (where the site keeps its state between messages;
default ``./fedmedbench-site``), ``device="cuda:0"`` (default: the CPU) and ``threads=2`` (CPU
threads, default 1: another count changes float summation order, hence the last digits, as for
``train --threads``; a federation equals a simulated run made with the same count). The site opens only its
own rows of the store. ``share-model=false`` / ``share-predictions=false`` keep the site's selected
model / its qualitative predictions (``predictions.npz`` samples) on the site: only its test scores
go up, and the server notes what the site withheld (``federation.json``, ``model_best.pt``). Flower starts a fresh ClientApp for every message, so everything the client
holds between rounds (its models, optimizer state, data generator, a method's deputies or personal
models, the model kept by selection) is the method's own ``Client.state_dict`` (the same state a
checkpoint holds), written atomically to ``<state-dir>/run-<key>/<client>.pt`` after each
message and read back before the next.

Keep: when validation improves a selection covering this site, the server sends nothing then; its
next message to the site (the next round's ``train``, or ``final``) carries ``keep=r``, and the site
first keeps its evaluated model of round r (the state file is still that round's end), saves that
as the end of round r, and only then takes a snapshot the same message asks for and runs the
message's own step. So every snapshot of a round holds the model kept at it. (A ``keep`` message of
its own is still answered, as an older ServerApp sends it.)

Resume: ``<key>`` is stable across a restarted server (Flower gives every ``flwr run`` a new run
id): a digest of the run's ``out`` folder (its run config's ``out``, which the simulation route's
dispatcher sets too; the run id where there is none). When the server checkpoints round r it says so in its next
message (``snapshot=r`` on round r+1's train message), and the site first copies its state file,
then still its state at the end of round r, to ``<client>.round-<r>.pt``; it keeps the snapshots of
the two latest checkpointed rounds (the server's checkpoint and the ``.prev`` it falls back to). A
restarted server's ``resume`` message names its checkpoint's round: the site goes back to that
snapshot (or to its state file, if that is still at the end of that round), else it refuses in one
line naming the site and round. If the server's restored selection kept this site's model at that
very round, the message says so (``keep=r``): the keep rode on a message the dead server never
sent, so the state file may lack it; the site applies it (a snapshot of r has it already).

A test-only cohort (the run's ``ood_clients``, e.g. PRR-FL's unseen institution) is a SuperNode of
its own whose node config names the cohort as ``client``; it opens only its own test rows. It keeps
no state: it answers ``hello`` (its data digest), then, after the run's final message, ``ood``: the
server sends every site's selected model and the cohort replies with their scores on its test rows
(per model, their mean, the ensemble), computed as the engine's ``evaluation.ood_test``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedmedbench.errors import MethodError
from fedmedbench.federation.messages import config_of, pack, unpack
from fedmedbench.files import atomic_file
from fedmedbench.fl import checkpoint
from fedmedbench.fl.data import SplitData, data_digest, load_clients, load_test_only
from fedmedbench.fl.hooks import load_method  # the engine's guarded hooks: a failure reads as the engine's line
from fedmedbench.fl.rounds import Cohort, Site, SiteError
from fedmedbench.fl.seeding import client_generator, seed_everything
from fedmedbench.models import build_model
from fedmedbench.runconfig import RunConfig

app = ClientApp()


def node_setting(context: Context, key: str, default=None):
    value = context.node_config.get(key, default)
    if value is None:
        raise SiteError(f"SuperNode node config: {key!r} is missing (e.g. --node-config '{key}=\"...\"')")
    return value


def node_flag(context: Context, key: str) -> bool:
    """A yes/no node-config key (default yes); ``share-model=false`` arrives as a bool, a string from
    another launcher as "false"."""
    value = context.node_config.get(key, True)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise SiteError(f"SuperNode node config: {key}={value!r} is not true or false")
    return value


def withheld(context: Context) -> list[str]:
    """What this site keeps to itself at the end of the run (``messages.WITHHOLDABLE``)."""
    return [what for what in ("model", "predictions") if not node_flag(context, f"share-{what}")]


def run_key(context: Context) -> str:
    """The name of this run's state folder, the same for a restarted server: a digest of the run
    folder the server writes (``out``), else Flower's run id."""
    out = context.run_config.get("out") if context.run_config else None
    return hashlib.sha256(str(out).encode()).hexdigest()[:16] if out else str(context.run_id)


def state_file(context: Context) -> Path:
    folder = Path(str(node_setting(context, "state-dir", "fedmedbench-site"))) / f"run-{run_key(context)}"
    return folder / f"{node_setting(context, 'client')}.pt"


def snapshot_file(context: Context, round_index: int) -> Path:
    """The site's state at the end of checkpointed round ``round_index``."""
    path = state_file(context)
    return path.with_name(f"{path.stem}.round-{round_index}.pt")


def snapshots(context: Context) -> dict[int, Path]:
    path = state_file(context)
    found = {}
    for candidate in path.parent.glob(f"{path.stem}.round-*.pt"):
        number = candidate.name[len(path.stem) + len(".round-") : -len(".pt")]
        if number.isdigit():
            found[int(number)] = candidate
    return found


def copy_atomic(source: Path, target: Path) -> None:
    with atomic_file(target) as handle:
        handle.write(source.read_bytes())


def round_done(path: Path) -> int | None:
    """The round whose end the state file ``path`` holds (None: mid-round, or no such file)."""
    return checkpoint.load_plain(path).get("round_done") if path.is_file() else None


def take_snapshot(context: Context, round_index: int, done: int | None) -> None:
    """Copy the state file (the end of checkpointed round ``round_index``) to its snapshot; keep the
    two latest snapshots (the server's checkpoint and its ``.prev``). ``done``: the round whose end
    the state file holds, as the caller read it (no second read of the file)."""
    path = state_file(context)
    if done != round_index:
        raise SiteError(
            f"site {node_setting(context, 'client')}: the server checkpointed round {round_index}, but this site's state at {path} is not at the end of that round; refused"
        )
    copy_atomic(path, snapshot_file(context, round_index))
    found = snapshots(context)
    for number in sorted(found)[:-2]:
        found[number].unlink(missing_ok=True)


def build_site(cfg_json: str, context: Context, train_rows: int | None = None) -> Site:
    """This node's ``Site`` for the run config ``cfg_json``, built as the engine builds a client
    (the same seed, model initialisation and data generator), from the node's own data only."""
    cfg = RunConfig.from_dict(json.loads(cfg_json))
    name = str(node_setting(context, "client"))
    if name not in cfg.clients:
        raise SiteError(
            f"site {name}: the run's clients are {list(cfg.clients)}; this SuperNode's client is not one of them"
        )
    index = list(cfg.clients).index(name)
    method = load_method(cfg.method, cfg.method_module)
    data = load_clients(
        Path(str(node_setting(context, "store"))), Path(str(node_setting(context, "split"))), [name], False
    )[0]
    if train_rows is not None:  # truncate_to_smallest: the smallest site's size, from the server
        train = data.train
        data.train = SplitData(
            train.images, train.labels, train.rows[:train_rows], train.groups[:train_rows], train.reader
        )
    device = torch.device(str(context.node_config.get("device", "cpu")))
    torch.set_num_threads(int(context.node_config.get("threads", 1)))
    seed_everything(cfg.seed, device)
    model = build_model(cfg.model)
    return Site(cfg, method.Client(cfg, index, data, model, client_generator(cfg.seed, index), device), device)


def load_site(context: Context) -> Site:
    path = state_file(context)
    if not path.is_file():
        raise SiteError(
            f"site {node_setting(context, 'client')}: no state at {path} (the run was not set up on this node, or its state-dir changed)"
        )
    saved = checkpoint.load_plain(path)
    site = build_site(saved["cfg"], context, saved["train_rows"])
    site.load_state_dict(saved["site"])
    site.cfg_json, site.train_rows, site.round_done = saved["cfg"], saved["train_rows"], saved.get("round_done")
    # The engine sets the client's round before training and it stays set through that round's
    # answer, evaluation (PRR-FL's receive reads it: round 0 loads the package into p) and keep.
    site.client.round_index = int(saved.get("round_index", 0))
    return site


def check_fingerprint(site: Site, context: Context, config) -> None:
    """The server's run config must be the one this site's state was made for."""
    mine = RunConfig.from_dict(json.loads(site.cfg_json)).fingerprint()
    if config.get("fingerprint") != mine:
        raise SiteError(
            f"site {node_setting(context, 'client')}: the server runs config fingerprint {config.get('fingerprint')}, this site's state at {state_file(context)} was made for {mine}; refused"
        )


def approve(context: Context, fingerprint: str) -> None:
    """``run-fingerprint`` in the node config: the one run config this site agreed to train (its
    IT team pins it); any other is refused before the site opens its data."""
    approved = context.node_config.get("run-fingerprint")
    if approved is not None and str(approved) != fingerprint:
        raise SiteError(
            f"site {node_setting(context, 'client')}: this SuperNode is approved for run config fingerprint {approved}, the server sent {fingerprint}; refused"
        )


def save_site(site: Site, context: Context, done: int | None = None) -> None:
    """``done``: the round this state is the end of (after its evaluate or keep message; 0 after
    setup), what a resumed server may go back to; None mid-round."""
    path = state_file(context)
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.save_plain(
        {
            "cfg": site.cfg_json,
            "train_rows": site.train_rows,
            "site": site.state_dict(),
            "round_index": site.client.round_index,
            "round_done": done,
        },
        path,
    )


def say_here(text: str) -> None:
    """A refusal in the site's own log too (the ClientApp's output is its SuperNode's): the site's IT
    team reads why, not only the server's operator."""
    print(f"fedmedbench: refused: {text}", file=sys.stderr, flush=True)


def error_reply(message: Message, name: str, err: Exception) -> Message:
    """A failure as one line naming the site (the server stops with it, adding the step and round)."""
    text = " ".join(str(err).split())
    if isinstance(err, MethodError):  # already names method, hook, round and client: read as the engine's
        return Message(RecordDict({"error": ConfigRecord({"text": text, "method": True})}), reply_to=message)
    if not text.startswith(f"site {name}"):  # our own refusals read as they are; anything else says what it was
        text = f"site {name}: {text}" if isinstance(err, SiteError) else f"site {name}: {type(err).__name__}: {text}"
    say_here(text)
    return Message(RecordDict({"error": ConfigRecord({"text": text})}), reply_to=message)


def reply(message: Message, value, **config) -> Message:
    return Message(pack(value, **config), reply_to=message)


def keep_model(site: Site, context: Context, round_index: int) -> None:
    """Keep the evaluated model of ``round_index`` (the site's state must be that round's end) and
    save the state as that round's end."""
    if site.round_done != round_index:
        raise SiteError(
            f"site {node_setting(context, 'client')}: the server asks it to keep its model of round {round_index}, but its state at {state_file(context)} is not at the end of that round; refused"
        )
    site.keep(round_index)
    save_site(site, context, round_index)


def kept_model(context: Context, round_index: int) -> None:
    """The site's state (its state file, that round's end) holds the model kept at ``round_index``:
    kept now unless it already is."""
    site = load_site(context)
    if site.kept is None or site.kept["round"] != round_index:
        keep_model(site, context, round_index)


def handle(message: Message, context: Context, step, ends_round: bool = False) -> Message:
    """Run ``step(site, payload, config) -> value | (value, reply config)`` on the loaded site, save
    it, reply; a failure goes back as one line naming the site (the server stops with it).
    ``ends_round``: after this step the state is the end of the message's round (evaluate, keep).
    A ``keep`` the message carries (the last round's selection) is applied first, then a
    ``snapshot`` (so a snapshot holds the model kept at its round), then the step."""
    name = str(context.node_config.get("client", "?"))
    try:
        site = load_site(context)
        check_fingerprint(site, context, config_of(message.content))
        config = config_of(message.content)
        if int(config.get("keep", -1)) >= 0:  # a selection improved at that round: keep its evaluated model
            keep_model(site, context, int(config["keep"]))
        if int(config.get("snapshot", -1)) >= 0:  # the server checkpointed that round: keep the site's state of it
            take_snapshot(context, int(config["snapshot"]), site.round_done)
        value = step(site, unpack(message.content, f"server message to site {name}"), config)
        save_site(site, context, int(config["round"]) if ends_round else None)
        value, config = value if isinstance(value, tuple) else (value, {})
        return reply(message, value, **config)
    except Exception as err:  # the server reports it: it names the site and the round
        return error_reply(message, name, err)


def build_cohort(cfg_json: str, context: Context):
    """This node's ``Cohort`` (a test-only cohort of the run): its own test rows only."""
    cfg = RunConfig.from_dict(json.loads(cfg_json))
    name = str(node_setting(context, "client"))
    split = Path(str(node_setting(context, "split")))
    try:
        data = load_test_only(Path(str(node_setting(context, "store"))), split, [name])[name]
    except ValueError as err:  # no test rows of this cohort in the split file
        raise SiteError(f"site {name}: {err}") from None
    torch.set_num_threads(int(context.node_config.get("threads", 1)))
    return Cohort(cfg, name, data, torch.device(str(context.node_config.get("device", "cpu"))))


def is_cohort(cfg_json: str, context: Context) -> bool:
    return str(node_setting(context, "client")) in json.loads(cfg_json).get("ood_clients", [])


@app.query("hello")
def hello(message: Message, context: Context) -> Message:
    """Who this node is and how many training rows it has (for ``truncate_to_smallest``); a test-only
    cohort says so (``test_only``) and has none."""
    name = str(context.node_config.get("client", "?"))
    try:
        cfg_json = config_of(message.content)["cfg"]
        kept_here = withheld(context)  # a bad share-* value stops the run now, not at its end
        fingerprint = RunConfig.from_dict(json.loads(cfg_json)).fingerprint()
        approve(context, fingerprint)
        cohort = is_cohort(cfg_json, context)
        rows = (
            len(build_cohort(cfg_json, context).split)
            if cohort
            else len(build_site(cfg_json, context).client.data.train)
        )
        # What this site reads, digested as the engine's checkpoints digest it (for this one client):
        # the server compares it with the run's expectation, or records it.
        digest = data_digest(
            Path(str(node_setting(context, "store"))), Path(str(node_setting(context, "split"))), [name]
        )
        expected = json.loads(str(config_of(message.content).get("digests", "{}"))).get(name)
        if expected is not None and digest != expected:  # refused here, so the site's own log says it
            raise SiteError(
                f"site {name}: its data digest is {digest}, the run expects {expected} (another store or split than the run was planned on); refused"
            )
        answer = {
            "client": name,
            "train_rows": 0 if cohort else rows,
            "data_digest": digest,
            "fingerprint": fingerprint,
            "withheld": kept_here,
        }
        return reply(message, {**answer, "test_only": True} if cohort else answer)
    except Exception as err:
        return error_reply(message, name, err)


@app.query("setup")
def setup(message: Message, context: Context) -> Message:
    name = str(context.node_config.get("client", "?"))
    try:
        config = config_of(message.content)
        train_rows = int(config["train_rows"]) if int(config["train_rows"]) >= 0 else None
        site = build_site(config["cfg"], context, train_rows)
        site.cfg_json, site.train_rows = config["cfg"], train_rows
        site.start(unpack(message.content, f"server setup for site {name}"))
        for old in snapshots(context).values():  # a fresh start: an earlier run's snapshots are not this one's
            old.unlink(missing_ok=True)
        save_site(site, context, 0)
        return reply(message, {"client": name})
    except Exception as err:
        return error_reply(message, name, err)


@app.train()
def train(message: Message, context: Context) -> Message:
    def step(site, _payload, config):
        # The method's reply is the payload (its state an ArrayRecord); the loss and the local-epoch
        # curve's history rows ride in the config record.
        reply_value, loss, rows = site.train(int(config["round"]))
        return reply_value, {"loss": loss, "rows": json.dumps(rows)}

    return handle(message, context, step)


@app.query("answer")
def answer(message: Message, context: Context) -> Message:
    return handle(message, context, lambda site, query, _config: site.answer(query))


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    def step(site, package, config):
        val, test = site.evaluate(int(config["round"]), package, bool(config["with_test"]))
        return {"val": val, "test": test}

    return handle(message, context, step, ends_round=True)


@app.query("keep")
def keep(message: Message, context: Context) -> Message:
    """A keep as a message of its own (an older ServerApp; this one sends it on the next message).
    The server does not need the kept model now: it stays here until the final message."""
    return handle(message, context, lambda site, _p, config: site.keep(int(config["round"])) and None, ends_round=True)


@app.query("resume")
def resume(message: Message, context: Context) -> Message:
    """A restarted server continues after its checkpoint of round ``round``: this site goes back to
    its state at the end of that round, or refuses in one line naming the site and round."""
    name = str(context.node_config.get("client", "?"))
    try:
        config = config_of(message.content)
        round_index, path = int(config["round"]), state_file(context)
        keep_here = (
            int(config.get("keep", -1)) == round_index
        )  # the dead server's selection kept this site at that round
        snapshot = snapshots(context).get(round_index)
        if snapshot is None and round_done(path) == round_index:
            # The state file is that round's end: with the keep the dead server never sent applied,
            # it becomes the round's snapshot (a later restart may need it again).
            if checkpoint.load_plain(path)["cfg"] != config["cfg"]:
                raise SiteError(
                    f"site {name}: cannot resume after round {round_index}: its state file {path} was made for another run config; refused"
                )
            if keep_here:
                kept_model(context, round_index)
            take_snapshot(context, round_index, round_index)  # its state file is at that round's end (checked above)
            snapshot = snapshot_file(context, round_index)
        if snapshot is None:
            have = sorted(snapshots(context))
            raise SiteError(
                f"site {name}: cannot resume after round {round_index}: no snapshot of that round in {path.parent} "
                f"(snapshots of round(s) {have or 'none'}; the state file is {'missing' if not path.is_file() else f'at round {round_done(path)}' if round_done(path) is not None else 'mid-round'}); refused"
            )
        saved = checkpoint.load_plain(snapshot)
        if saved["cfg"] != config["cfg"]:
            raise SiteError(
                f"site {name}: cannot resume after round {round_index}: its snapshot {snapshot} was made for another run config; refused"
            )
        copy_atomic(snapshot, path)
        for number, later in snapshots(
            context
        ).items():  # a dead run's snapshots past the checkpoint are not this run's
            if number > round_index:
                later.unlink(missing_ok=True)
        if keep_here:  # a snapshot holds its round's keep (applied before it was taken): a no-op, checked
            kept_model(context, round_index)
        return reply(message, {"client": name, "round": round_index})
    except Exception as err:
        return error_reply(message, name, err)


@app.query("final")
def final(message: Message, context: Context) -> Message:
    def step(site, _payload, _config):
        out, kept_here = site.final(), withheld(context)
        return {**{k: v for k, v in out.items() if k not in kept_here}, "withheld": kept_here} if kept_here else out

    return handle(message, context, step)


@app.query("ood")
def ood(message: Message, context: Context) -> Message:
    """A test-only cohort scores every site's selected model on its own test rows (nothing is kept)."""
    name = str(context.node_config.get("client", "?"))
    try:
        config = config_of(message.content)
        fingerprint = RunConfig.from_dict(json.loads(config["cfg"])).fingerprint()
        approve(context, fingerprint)
        if config.get("fingerprint") != fingerprint:
            raise SiteError(
                f"site {name}: the server's message names run config fingerprint {config.get('fingerprint')}, its config reads as {fingerprint}; refused"
            )
        if not is_cohort(config["cfg"], context):
            raise SiteError(f"site {name}: it is not a test-only cohort of this run; refused")
        payload = unpack(message.content, f"server message to cohort {name}")
        if not isinstance(payload, dict) or not isinstance(payload.get("models"), dict):
            raise SiteError(f"site {name}: the server's ood message holds no models; refused")
        return reply(message, build_cohort(config["cfg"], context).score(payload["models"]))
    except Exception as err:
        return error_reply(message, name, err)
