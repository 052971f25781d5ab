"""Model selection on validation: which rounds may be selected, and the best round(s) with the
models and predictions kept at them (one global choice, or one per client).

Below both the engine (``fl/engine.py``) and the round protocol (``fl/rounds.py``, whose loop
records the selections); the run folder (``fl/runfolder.py``) checkpoints it.
"""

from __future__ import annotations

import math

from fedmedbench.errors import DataError
from fedmedbench.runconfig import RunConfig


class Selection:
    """Tracks the best round on validation: one global choice, or one per client (personalized).

    Per choice it keeps the round, the validation scores, the evaluated models and the qualitative
    predictions at that round. Test scores are not tracked here: the selected models are evaluated on
    test once, at the end (``final_test``). ``version`` changes whenever a choice changes, so the
    models are written to disk only then.
    """

    def __init__(self, clients: list[str], metric: str, per_client: bool):
        self.clients, self.metric, self.per_client = clients, metric, per_client
        self.best: dict[str, dict] = {}  # client name or "all" -> {"round", "score", "val", "models", "predictions"}
        self.version = 0

    def improved(self, val: dict[str, dict], round_index: int) -> dict[str, list[str]]:
        """The choices this round's validation scores improve: {key: the clients it covers}. An
        undefined (NaN) score is an error, never a comparison that silently fails every round
        (``check_selection_defined`` rules out the splits that cannot define the metric)."""
        undefined = [n for n in self.clients if math.isnan(val[n][self.metric])]
        if undefined:
            raise DataError(
                f"round {round_index}: validation {self.metric} is undefined (NaN) for client(s) {', '.join(undefined)}; model selection cannot compare rounds"
            )
        keys = {name: [name] for name in self.clients} if self.per_client else {"all": self.clients}
        better = {}
        for key, names in keys.items():
            score = sum(val[n][self.metric] for n in names) / len(names)
            if key not in self.best or score > self.best[key]["score"]:
                better[key] = names
        return better

    def record(
        self, key: str, round_index: int, val: dict, models: dict[str, dict], predictions: dict[str, dict]
    ) -> None:
        names = list(models)
        score = sum(val[n][self.metric] for n in names) / len(names)
        self.best[key] = {
            "round": round_index,
            "score": score,
            "val": {n: val[n] for n in names},
            "models": models,
            "predictions": predictions,
        }
        self.version += 1

    def merged(self, part: str) -> dict:
        out = {}
        for entry in self.best.values():
            out.update(entry[part])
        return out

    def state_dict(self) -> dict:
        """The light part (rounds, scores), stored in every checkpoint."""
        light = {
            key: {k: v for k, v in entry.items() if k not in ("models", "predictions")}
            for key, entry in self.best.items()
        }
        return {"best": light, "version": self.version}

    def heavy_state(self) -> dict:
        """Models and predictions, written only when ``version`` changes."""
        return {key: {"models": e["models"], "predictions": e["predictions"]} for key, e in self.best.items()}

    def load_state_dict(self, state: dict, heavy: dict) -> None:
        self.best = {key: {**entry, **heavy[key]} for key, entry in state["best"].items()}
        self.version = state["version"]


def selection_open(cfg: RunConfig, round_index: int) -> bool:
    """Whether round ``round_index`` may be selected: one of the last ``selection_window`` x rounds
    (PRR-FL's code: ``a_iter >= 0.8 iters``, i.e. the last 10 of 50 rounds)."""
    window = max(1, round(cfg.selection_window * cfg.rounds))
    return round_index > cfg.rounds - window
