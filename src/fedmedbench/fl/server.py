"""Base server: holds the global state and aggregates replies. The base behaviour is FedAvg's server.

The replies (and answers) it aggregates are its own copies, and each client receives its own copy of
its package, in either runtime: an in-place edit on either side reaches no one else
(fl/rounds.py ``own_copy``). A hook that fails is named with its method, round and client
(fl/hooks.py)."""

from __future__ import annotations

from torch import nn

from fedmedbench.ops.aggregate import aggregation_weights, clone_state, weighted_average
from fedmedbench.runconfig import RunConfig


class Server:
    def __init__(self, cfg: RunConfig, model: nn.Module, num_clients: int):
        self.cfg = cfg
        self.params = cfg.method_params
        self.num_clients = num_clients
        self.global_state = clone_state(model.state_dict())
        self.round_index = 0  # set by the round loop at the start of each round (as Client.round_index)

    def package(self, client_index: int, round_index: int) -> dict | None:
        """What client ``client_index`` receives after round ``round_index`` (0: before training)."""
        return {"state": self.global_state}

    def query(self, round_index: int, replies: list[dict]) -> list | None:
        """An optional second exchange in a round, after the replies and before aggregation: one
        query per client (e.g. a model to evaluate on its validation data); each client's
        ``answer(query)`` lands in its reply as ``reply["answer"]``. ``None``: no second exchange."""
        return None

    def round_log(self, round_index: int) -> dict[int, dict[str, float]]:
        """Per-client scalars worth a line in history.csv (split ``server``), e.g. contribution
        scores or aggregation weights: {client index: {name: value}}."""
        return {}

    def aggregate(self, round_index: int, replies: list[dict]) -> None:
        weights = aggregation_weights([r["num_samples"] for r in replies], self.cfg.aggregation.weighting)
        # Keys every client sent; a key kept local by any client is not averaged.
        keys = set.intersection(*(set(r["state"]) for r in replies))
        self.global_state.update(weighted_average([r["state"] for r in replies], weights, sorted(keys)))

    def state_dict(self) -> dict:
        return {"global_state": self.global_state}

    def load_state_dict(self, state: dict) -> None:
        self.global_state = state["global_state"]
