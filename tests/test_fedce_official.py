"""FedCE's coefficient update against an independent transcription of the 2023 NVFlare code
(research/fed-ce, ``fedce_assembler.py`` at ``27267db96^``; ../shared/specs/methods.md §2.14), over
three real rounds of our engine.

The 2023 assembler keeps a coefficient record that it fills with 1/K at round 0 and never updates (the
new coefficients go into a separate dict that is sent to the clients), so the consensus direction of
the cosine is always the uniform mean of the updates. The transcription below follows that code's
steps: consensus in float32 over the trainable parameters, ``torch.cosine_similarity`` of the update
with consensus - (1/K)·update, the historical mean of the cosines, normalise then clip at 1e-3 (cosine
weights and minus-model values), "plus" / "times", normalise then clip again.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmedbench.fl.engine import run_training
from fedmedbench.methods import fedce
from fedmedbench.models import build_model
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config


def fedce_2023(rounds, param_names, mode, dtype=torch.float32):
    """rounds: per round (diffs: one {name: tensor} per site, minus_vals: one float per site);
    returns the coefficients after each round. The 2023 code works on the float32 updates; ``dtype``
    float64 gives the same steps without float32 rounding (our server's precision)."""
    sites = range(len(rounds[0][0]))
    record, cos_sim, out = {}, {}, []
    for current_round, (diffs, minus_vals) in enumerate(rounds):
        if current_round == 0:
            record = {site: 1 / len(sites) for site in sites}
        consensus = []
        for name in param_names:
            temp = torch.zeros_like(diffs[0][name], dtype=dtype)
            for site in sites:
                temp += record[site] * diffs[site][name].to(dtype)
            consensus.append(temp.view(-1))
        consensus = torch.cat(consensus)
        cos_sim[current_round] = {}
        for site in sites:
            vec = torch.cat([diffs[site][name].view(-1).to(dtype) for name in param_names])
            minus = consensus - record[site] * vec
            cos_sim[current_round][site] = torch.cosine_similarity(vec, minus, dim=0).item()
        cos_weights = [1.0 - np.mean([cos_sim[i][site] for i in range(current_round + 1)]) for site in sites]
        cos_weights = np.clip(np.asarray(cos_weights) / np.sum(cos_weights), 1e-3, None)
        values = np.clip(np.asarray(minus_vals) / np.sum(minus_vals), 1e-3, None)
        new = cos_weights * values if mode == "times" else cos_weights + values
        new = np.clip(new / np.sum(new), 1e-3, None)
        out.append(list(new))
        # the record is not updated: the 2023 code's consensus prior stays uniform
    return out


@pytest.mark.parametrize("combine, mode", [("sum", "plus"), ("multi", "times")])
def test_default_prior_is_the_2023_codes_uniform_one_over_three_real_rounds(
    tiny_task, tmp_path, monkeypatch, combine, mode
):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedce", rounds=3, method_params={"combine": combine})
    seen = []
    original = fedce.Server.aggregate

    def recording(self, round_index, replies):
        before = {k: v.detach().clone() for k, v in self.global_state.items()}
        states = [{k: v.detach().clone() for k, v in r["state"].items()} for r in replies]
        original(self, round_index, replies)
        seen.append(
            {
                "before": before,
                "states": states,
                "scores": [r["answer"]["score"] for r in replies],
                "coefficients": list(self.coefficients),
            }
        )

    monkeypatch.setattr(fedce.Server, "aggregate", recording)
    run_training(cfg, tmp_path / "run", progress=False)
    assert len(seen) == 3

    model = build_model(RunConfig.from_dict(cfg).model)
    param_names = [name for name, p in model.named_parameters() if p.requires_grad]
    rounds = [([{n: s[n] - r["before"][n] for n in param_names} for s in r["states"]], r["scores"]) for r in seen]
    expected = fedce_2023(rounds, param_names, mode, torch.float64)
    official_precision = fedce_2023(rounds, param_names, mode, torch.float32)
    for r in range(3):
        assert seen[r]["coefficients"] == pytest.approx(expected[r], abs=1e-12), r
        # the 2023 code's float32 cosines: 1 - cos amplifies their rounding (~2e-6 here)
        assert seen[r]["coefficients"] == pytest.approx(official_precision[r], abs=1e-5), r

    # The refactor's prior (previous coefficients) on the same updates and scores: another number.
    previous = fedce.Server(
        RunConfig.from_dict({**cfg, "method_params": {**fedce.DEFAULTS, "combine": combine, "prior": "previous"}}),
        model,
        3,
    )
    for r, record in enumerate(seen, start=1):
        previous.global_state = {k: v.clone() for k, v in record["before"].items()}
        original(
            previous,
            r,
            [
                {"state": s, "num_samples": 4, "steps": 1, "answer": {"score": sc}}
                for s, sc in zip(record["states"], record["scores"])
            ],
        )
    # 7.5e-5 (sum) and 2.6e-4 (multi) on this task after 3 rounds; 1e-12 is the agreement above
    assert max(abs(a - b) for a, b in zip(previous.coefficients, expected[2])) > 2e-5
