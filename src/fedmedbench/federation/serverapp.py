"""The generic ServerApp: any method's ``Server`` over Flower's ``Grid``, with the engine's round loop
(``fedmedbench.fl.transport.run_rounds``) and the engine's outputs.

Run config (``flwr run ... --run-config``): ``run-config`` (a resolved run config as JSON, what
Snakemake passes to ``fedmedbench train``; its data paths are not opened here: the server opens no
store), ``out`` (the run folder: history.csv, final.json, model_best.pt, predictions.npz, written
as the engine writes them), ``nodes-timeout`` (seconds to wait for every site's SuperNode) and
``reply-timeout`` (seconds a round waits for the sites' replies; 0: no limit).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedmedbench.federation.messages import check_reply, check_scores, pack, unpack
from fedmedbench.fl.transport import SiteError, serve

app = ServerApp()


def payload_bytes(records) -> int:
    """The bytes a message's records hold (tensors, metrics, configs), each record as Flower counts it."""
    return sum(record.count_bytes() for record in records.values())


class FlowerTransport:
    """The sites behind the SuperNodes of ``grid``: one message per site and step, in client order."""

    def __init__(self, grid: Grid, cfg, nodes_timeout: float = 300.0, reply_timeout: float | None = None):
        self.grid, self.cfg, self.reply_timeout = grid, cfg, reply_timeout
        self.names = list(cfg.clients)
        self.cfg_json = json.dumps(cfg.to_dict(), sort_keys=True)
        self.reference = None  # the global model's state: the shape of a valid reply
        self.bytes_sent = self.bytes_received = 0  # payload bytes (records), each way
        self.node = self._find_sites(nodes_timeout)

    # --- messaging ------------------------------------------------------------------------------
    def _exchange(self, message_type: str, payloads: dict[int, object], step: str, **config) -> dict[int, tuple[object, dict]]:
        """Send ``payloads[node]`` to each node; {node: (payload, reply config)}, or one error line
        naming the site and step for a missing, failed or malformed reply."""
        messages = [Message(pack(value, **config), node, message_type, group_id=step) for node, value in payloads.items()]
        self.bytes_sent += sum(payload_bytes(m.content) for m in messages)
        replies = {m.metadata.src_node_id: m for m in self.grid.send_and_receive(messages, timeout=self.reply_timeout)}
        site_of = {node: name for name, node in getattr(self, "node", {}).items()}
        out = {}
        for node in payloads:
            where = f"{step}: site {site_of.get(node, f'node {node}')}"
            message = replies.get(node)
            if message is None:
                raise SiteError(f"{where}: no reply within {self.reply_timeout} s (the SuperNode stopped or lost its connection)")
            if message.has_error():
                raise SiteError(f"{where}: Flower error {message.error.code}: {message.error.reason}")
            if "error" in message.content:
                raise SiteError(f"{step}: {message.content['error']['text']}")
            self.bytes_received += payload_bytes(message.content)
            out[node] = (unpack(message.content, where), dict(message.content["c"]))
        return out

    def _find_sites(self, timeout: float) -> dict[str, int]:
        """Wait for one SuperNode per client, ask each which site it is: {client: node id}."""
        deadline = time.monotonic() + timeout
        while len(list(self.grid.get_node_ids())) < len(self.names):
            if time.monotonic() > deadline:
                raise SiteError(f"{len(list(self.grid.get_node_ids()))} SuperNode(s) connected within {timeout:.0f} s; the run needs one per client: {', '.join(self.names)}")
            time.sleep(0.5)
        nodes = sorted(self.grid.get_node_ids())
        hello = self._exchange("query.hello", {node: None for node in nodes}, "hello", cfg=self.cfg_json)
        node_of, rows = {}, {}
        for node, (value, _) in hello.items():
            name = value["client"]
            if name in node_of:
                raise SiteError(f"hello: two SuperNodes (ids {node_of[name]} and {node}) say they are site {name}")
            if name not in self.names:
                raise SiteError(f"hello: SuperNode {node} is site {name}, which is not a client of run {self.cfg.run} ({', '.join(self.names)})")
            node_of[name], rows[name] = node, int(value["train_rows"])
        missing = [n for n in self.names if n not in node_of]
        if missing:
            raise SiteError(f"hello: no SuperNode serves site(s) {', '.join(missing)}")
        self.train_rows = min(rows.values()) if self.cfg.truncate_to_smallest else -1
        return node_of

    def _by_site(self, results: dict[int, tuple]) -> list[tuple]:
        return [results[self.node[name]] for name in self.names]

    # --- the transport ------------------------------------------------------------------------
    def start(self, packages):
        self.reference = packages[0]["state"] if isinstance(packages[0], dict) and "state" in packages[0] else None
        self._exchange("query.setup", dict(zip(self._nodes(), packages)), "setup", cfg=self.cfg_json, train_rows=self.train_rows)

    def _nodes(self):
        return [self.node[name] for name in self.names]

    def train(self, round_index):
        results = self._by_site(self._exchange("train", {node: None for node in self._nodes()}, f"round {round_index} train", round=round_index))
        out = []
        for name, (reply, config) in zip(self.names, results):
            if self.reference is not None:
                check_reply(f"round {round_index}: site {name}", reply, self.reference)
            out.append((reply, float(config["loss"]), json.loads(config["rows"])))
        return out

    def answer(self, round_index, queries):
        results = self._exchange("query.answer", dict(zip(self._nodes(), queries)), f"round {round_index} answer", round=round_index)
        return [value for value, _ in self._by_site(results)]

    def evaluate(self, round_index, packages, with_test):
        results = self._exchange("evaluate", dict(zip(self._nodes(), packages)), f"round {round_index} evaluate", round=round_index, with_test=with_test)
        out = []
        for name, (value, _) in zip(self.names, self._by_site(results)):
            check_scores(f"round {round_index}: site {name} val", value["val"])
            out.append((value["val"], value["test"]))
        return out

    def keep(self, round_index, names):
        self._exchange("query.keep", {self.node[n]: None for n in names}, f"round {round_index} keep", round=round_index)
        return {n: ({}, {}) for n in names}  # the models stay on the sites until the final message

    def final(self):
        results = self._exchange("query.final", {node: None for node in self._nodes()}, "final")
        return {name: value for name, (value, _) in zip(self.names, self._by_site(results))}


def read_run_config(path: str):
    from fedmedbench.methods import merge_params
    from fedmedbench.runconfig import RunConfig

    cfg = RunConfig.from_dict(json.loads(Path(path).read_text()), where=path)
    return cfg.replace(method_params=merge_params(cfg.method, cfg.method_params, f"run config {path}: method_params", cfg.method_module))


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = context.run_config
    cfg = read_run_config(str(settings["run-config"]))
    reply_timeout = float(settings.get("reply-timeout", 0)) or None
    transport = FlowerTransport(grid, cfg, float(settings.get("nodes-timeout", 300)), reply_timeout)
    serve(cfg, Path(str(settings["out"])), transport, progress=True)
    traffic = {"bytes_sent": transport.bytes_sent, "bytes_received": transport.bytes_received, "rounds": cfg.rounds, "sites": len(transport.names)}
    (Path(str(settings["out"])) / "federation.json").write_text(json.dumps(traffic, indent=2) + "\n")
