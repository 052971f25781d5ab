"""Fed-LWR's figures, the Std row and the official select-on-test switch (no torch)."""

import pandas as pd
import pytest

from fedmedbench.report import fedlwr
from fedmedbench.report.tables import seed_summary


def history():
    rows = []
    for rnd, values in ((1, (0.5, 0.7)), (2, (0.9, 0.6)), (3, (0.8, 0.8))):
        for client, v in zip(("A", "B"), values):
            rows.append({"round": rnd, "client": client, "split": "test", "metric": "dice_paper", "value": v})
            rows.append({"round": rnd, "client": client, "split": "val", "metric": "dice_paper", "value": 1 - v})
            for i, layer in enumerate(("enc.0", "enc.1", "head")):
                rows.append(
                    {"round": rnd, "client": client, "split": "server", "metric": f"cka:{layer}", "value": v - 0.1 * i}
                )
    return pd.DataFrame(rows)


def final(per_client=False):
    return {"run": "fedlwr", "method": "fedlwr", "seed": 0, "clients": ["A", "B"], "client_labels": ["A", "B"],
            "selection": {"split": "val", "per_client": per_client}, "test": {"A": {"dice_paper": 0.5}, "B": {"dice_paper": 0.7}}}  # fmt: skip


def test_avg_and_population_std_curves():
    curve = fedlwr.avg_std_curves([history()], "dice_paper")
    assert curve.loc[1, "avg"] == pytest.approx(60.0) and curve.loc[1, "std"] == pytest.approx(10.0)  # ddof = 0
    assert curve.loc[2, "std"] == pytest.approx(15.0)


def test_select_on_test_picks_the_best_mean_test_round_or_per_client():
    out = fedlwr.select_on_test(final(), history(), "dice_paper")
    assert out["test"]["A"]["dice_paper"] == 0.8 and out["test"]["B"]["dice_paper"] == 0.8  # round 3: mean 0.8
    personal = fedlwr.select_on_test(final(per_client=True), history(), "dice_paper")
    assert personal["test"]["A"]["dice_paper"] == 0.9 and personal["test"]["B"]["dice_paper"] == 0.8
    sparse = history()[history()["round"] != 2]
    sparse = pd.concat(
        [sparse, pd.DataFrame([{"round": 2, "client": "A", "split": "train", "metric": "loss", "value": 1.0}])]
    )
    with pytest.raises(ValueError, match="curve_every"):
        fedlwr.select_on_test(final(), sparse, "dice_paper")


def test_layer_cka_table_keeps_model_order():
    table = fedlwr.layer_cka_table(history())
    assert list(dict.fromkeys(table["layer"])) == ["enc.0", "enc.1", "head"]
    assert table[(table["round"] == 1) & (table["client"] == "A")]["cka"].tolist() == pytest.approx([0.5, 0.4, 0.3])


def test_figures_are_written(tmp_path):
    fedlwr.layer_cka_figure(history(), tmp_path / "cka", "Fig. 1b")
    fedlwr.fairness_curves({"fedlwr": [history()]}, "dice_paper", tmp_path / "curves", "Fig. 2")
    summary = seed_summary([final()], "dice_paper", std_row=True)
    fedlwr.fairness_bars(summary, ["fedlwr"], tmp_path / "bars", "bars", "dice_paper")
    for name in ("cka", "curves", "bars"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000 and (tmp_path / f"{name}.pdf").exists()
