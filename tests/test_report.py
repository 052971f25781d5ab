"""Report layer: seed summaries, paper-layout tables, figures, comparison with the papers.

Numbers are hand-computed; see the comments next to each expectation.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedmedbench.report.compare import compare, load_paper_table, write_report
from fedmedbench.report.figures import convergence, seed_band
from fedmedbench.report.tables import (
    ReportInputError,
    format_cell,
    latex_escape,
    seed_summary,
    write_table,
)

PAPER_TABLES = Path(__file__).resolve().parents[1] / "resources" / "paper_tables"
CLIENTS = ["BIDMC", "HK", "I2CVB"]
LABELS = ["A", "B", "C"]


def make_final(run, seed, values, metric="dice_paper", method=None, clients=CLIENTS, labels=LABELS, split="test"):
    return {
        "task": "prostate",
        "method": method or run.split("-")[0],
        "run": run,
        "seed": seed,
        "clients": list(clients),
        "client_labels": list(labels),
        "synthetic": True,
        "primary_metric": metric,
        split: {c: {metric: v, "loss": 0.1} for c, v in zip(clients, values)},
    }


@pytest.fixture
def finals():
    # fedavg:  A 0.90/0.92, B 0.80/0.84, C 0.70/0.70
    # harmofl: A 0.95/0.97, B 0.90/0.90, C 0.85/0.87
    return [
        make_final("fedavg", 0, [0.90, 0.80, 0.70]),
        make_final("fedavg", 1, [0.92, 0.84, 0.70]),
        make_final("harmofl", 0, [0.95, 0.90, 0.85]),
        make_final("harmofl", 1, [0.97, 0.90, 0.87]),
    ]


def cell(summary, run, label):
    row = summary[(summary["run"] == run) & (summary["client_label"] == label)]
    assert len(row) == 1
    return row.iloc[0]


# ------------------------------------------------------------------------------ seed_summary


def test_seed_summary_hand_computed(finals):
    s = seed_summary(finals, "dice_paper")
    assert list(s.columns) == ["run", "method", "client", "client_label", "mean", "std", "n_seeds"]
    assert list(s["client_label"]) == ["A", "B", "C", "Avg"] * 2
    # per client: mean over seeds, sample std (ddof=1); two values differing by d -> d/sqrt(2)
    expected = {
        ("fedavg", "A"): (91.0, math.sqrt(2)),
        ("fedavg", "B"): (82.0, 2 * math.sqrt(2)),
        ("fedavg", "C"): (70.0, 0.0),
        ("harmofl", "A"): (96.0, math.sqrt(2)),
        ("harmofl", "B"): (90.0, 0.0),
        ("harmofl", "C"): (86.0, math.sqrt(2)),
        # Avg: mean of the client means; std across clients (ddof=1):
        # fedavg: (91+82+70)/3 = 81; deviations 10, 1, -11 -> sqrt(222/2) = sqrt(111)
        ("fedavg", "Avg"): (81.0, math.sqrt(111)),
        # harmofl: (96+90+86)/3 = 272/3; deviations 16/3, -2/3, -14/3 -> sqrt((456/9)/2)
        ("harmofl", "Avg"): (272 / 3, math.sqrt(456 / 9 / 2)),
    }
    for (run, label), (mean, std) in expected.items():
        row = cell(s, run, label)
        assert row["mean"] == pytest.approx(mean, abs=1e-9), (run, label)
        assert row["std"] == pytest.approx(std, abs=1e-9), (run, label)
        assert row["n_seeds"] == 2
    assert cell(s, "fedavg", "A")["client"] == "BIDMC"
    assert math.isclose(math.sqrt(111), 10.535653752852738)


def test_seed_summary_std_row_is_the_seed_mean_of_each_runs_population_std(finals):
    s = seed_summary(finals, "dice_paper", std_row=True)
    row = cell(s, "fedavg", "Std")
    # seed 0: 90, 80, 70 -> sqrt(200/3); seed 1: 92, 84, 70 -> mean 82, deviations 10, 2, -12 ->
    # sqrt(248/3); the Std row is their mean (not the std of the seed means 91, 82, 70: sqrt(74)),
    # its spread their sample std over seeds.
    a, b = math.sqrt(200 / 3), math.sqrt(248 / 3)
    assert row["mean"] == pytest.approx((a + b) / 2)
    assert row["std"] == pytest.approx(abs(a - b) / math.sqrt(2))
    assert row["mean"] > math.sqrt(74)  # the std of seed means is biased low


def test_one_seed_std_is_nan_and_shown_as_dash(tmp_path):
    s = seed_summary([make_final("fedavg", 0, [0.9, 0.8, 0.7])], "dice_paper")
    assert math.isnan(cell(s, "fedavg", "A")["std"])
    # Avg std is across clients, so it exists even with one seed: sqrt(((10)^2+0+(10)^2)/2)=10
    assert cell(s, "fedavg", "Avg")["std"] == pytest.approx(10.0)
    assert format_cell(90.0, float("nan")) == "90.00 (–)"
    write_table(s, tmp_path / "t", [("fedavg", "FedAvg")], "one seed")
    md = (tmp_path / "t.md").read_text()
    assert "| FedAvg | 90.00 (–) | 80.00 (–) | 70.00 (–) | **80.00 (10.00)** |" in md
    assert "90.00 (--)" in (tmp_path / "t.tex").read_text()


def test_mismatched_clients_raise_with_source(finals):
    bad = make_final("fedavg", 2, [0.9, 0.8, 0.7], clients=["BIDMC", "HK", "UCL"])
    with pytest.raises(ReportInputError, match=r"disagree on clients.*seed 2.*runs/fedavg/2"):
        seed_summary(finals + [bad], "dice_paper", sources=[f"f{i}" for i in range(4)] + ["runs/fedavg/2/final.json"])


def test_missing_metric_and_duplicate_seed_raise(finals):
    with pytest.raises(ReportInputError, match=r"run 'fedavg', seed 0 \(a.json\).*'dice_fg'"):
        seed_summary(finals, "dice_fg", sources=["a.json", "b.json", "c.json", "d.json"])
    with pytest.raises(ReportInputError, match="seed 1 twice"):
        seed_summary(finals + [make_final("fedavg", 1, [0.9, 0.8, 0.7])], "dice_paper")
    with pytest.raises(ReportInputError, match="no 'val' section"):
        seed_summary(finals, "dice_paper", split="val")


# ------------------------------------------------------------------------------ write_table


def test_write_table_layout_bold_and_escapes(tmp_path, finals):
    s = seed_summary(finals, "dice_paper")
    paths = write_table(
        s,
        tmp_path / "tab",
        [("fedavg", "FedAvg"), ("harmofl", "Harmo_FL 100%"), ("fedbn", "FedBN")],
        caption="Dice_paper (%) on prostate",
    )
    assert [p.name for p in paths] == ["tab.csv", "tab.md", "tab.tex"]
    md = (tmp_path / "tab.md").read_text()
    assert "| Method | A | B | C | Avg |" in md
    assert "| FedAvg | 91.00 (1.41) | 82.00 (2.83) | 70.00 (0.00) | 81.00 (10.54) |" in md
    # best Avg (90.67) is bold; the run without results is n/a everywhere
    assert "| Harmo_FL 100% | 96.00 (1.41) | 90.00 (0.00) | 86.00 (1.41) | **90.67 (5.03)** |" in md
    assert "| FedBN | n/a | n/a | n/a | n/a |" in md

    tex = (tmp_path / "tab.tex").read_text()
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"\caption{Dice\_paper (\%) on prostate}" in tex
    assert r"Harmo\_FL 100\% & 96.00 (1.41) & 90.00 (0.00) & 86.00 (1.41) & \textbf{90.67 (5.03)} \\" in tex
    assert r"\begin{tabular}{lcccc}" in tex

    csv = pd.read_csv(tmp_path / "tab.csv")
    assert list(csv.columns) == ["row", "run", "client", "mean", "std", "n_seeds"]
    assert len(csv) == 3 * 4
    avg = csv[(csv["run"] == "fedavg") & (csv["client"] == "Avg")].iloc[0]
    assert avg["mean"] == pytest.approx(81.0) and avg["std"] == pytest.approx(math.sqrt(111))
    assert csv[csv["run"] == "fedbn"]["mean"].isna().all()
    # atomic writes leave no temporary files behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tab.csv", "tab.md", "tab.tex"]


def test_paper_cell_format(tmp_path):
    s = pd.DataFrame(
        [
            dict(run="fedavg", method="fedavg", client="BIDMC", client_label="A", mean=90.04, std=1.27, n_seeds=3),
            dict(
                run="fedavg", method="fedavg", client="Avg", client_label="Avg", mean=90.04, std=float("nan"), n_seeds=3
            ),
        ]
    )
    write_table(s, tmp_path / "t", [("fedavg", "FedAvg")], "x")
    assert "| FedAvg | 90.04 (1.27) | **90.04 (–)** |" in (tmp_path / "t.md").read_text()
    assert format_cell(90.0449, 1.2651) == "90.04 (1.27)"
    assert format_cell(float("nan"), 1.0) == "n/a"
    assert format_cell(2.5, float("nan"), decimals=1, with_std=False) == "2.5"


def test_latex_escape():
    assert latex_escape("fed_prox 10% a&b #1 $x$ {y}") == (r"fed\_prox 10\% a\&b \#1 \$x\$ \{y\}")
    assert latex_escape(r"a\b~c^d") == r"a\textbackslash{}b\textasciitilde{}c\textasciicircum{}d"


# ------------------------------------------------------------------------------ compare


def write_paper_csv(path):
    path.write_text(
        "paper,table,task,method,method_id,client,metric,mean,std\n"
        "harmofl,1,prostate,FedAvg,fedavg,A,dice,90.00,1.00\n"
        "harmofl,1,prostate,FedAvg,fedavg,B,dice,83.50,0.50\n"
        "harmofl,1,prostate,FedAvg,fedavg,C,dice,70.0,\n"
        "harmofl,1,prostate,FedAvg,fedavg,Avg,dice,81.17,10.00\n"
        "harmofl,1,prostate,HarmoFL,harmofl,Avg,dice,91.00,2.00\n"
    )
    return path


def test_load_paper_table(tmp_path):
    p = load_paper_table(write_paper_csv(tmp_path / "paper.csv"))
    assert p["mean"].dtype == float and p["std"].dtype == float
    assert math.isnan(p.loc[2, "std"])
    assert list(p["decimals"]) == [2, 2, 1, 2, 2]
    with pytest.raises(ValueError, match="not a paper result table"):
        load_paper_table(PAPER_TABLES / "prrfl_table1_dataset.csv")


def test_compare_diff(tmp_path, finals):
    s = seed_summary(finals, "dice_paper")
    paper = load_paper_table(write_paper_csv(tmp_path / "paper.csv"))
    c = compare(s, paper, {"fedavg": "fedavg", "harmofl": "harmofl", "solo": "solo"})
    assert list(c.columns) == [
        "run",
        "method_id",
        "client",
        "ours_mean",
        "ours_std",
        "n_seeds",
        "paper_mean",
        "paper_std",
        "diff",
    ]
    fa = c[c["run"] == "fedavg"].set_index("client")
    assert list(fa.index) == ["A", "B", "C", "Avg"]
    assert fa.loc["A", "diff"] == pytest.approx(1.0)  # 91 - 90
    assert fa.loc["B", "diff"] == pytest.approx(-1.5)  # 82 - 83.5
    assert fa.loc["C", "diff"] == pytest.approx(0.0)  # 70 - 70
    assert fa.loc["Avg", "diff"] == pytest.approx(-0.17)  # 81 - 81.17
    assert fa.loc["A", "paper_std"] == 1.0 and math.isnan(fa.loc["C", "paper_std"])
    hf = c[c["run"] == "harmofl"].set_index("client")
    assert math.isnan(hf.loc["A", "paper_mean"]) and math.isnan(hf.loc["A", "diff"])
    assert hf.loc["Avg", "diff"] == pytest.approx(272 / 3 - 91.0)
    # solo: no result of ours and no paper row -> no rows at all
    assert (c["run"] == "solo").sum() == 0
    # solo with results but no paper row keeps NaN paper values
    s2 = seed_summary(finals + [make_final("solo", 0, [0.5, 0.5, 0.5])], "dice_paper")
    c2 = compare(s2, paper, {"solo": "solo"})
    assert len(c2) == 4 and c2["paper_mean"].isna().all() and c2["diff"].isna().all()


def test_harmofl_avg_parenthesis_is_std_across_clients():
    """Our Avg convention reproduces the paper's printed Avg (mean, std) from its client means."""
    paper = load_paper_table(PAPER_TABLES / "harmofl_table1_prostate.csv")
    labels = ["A", "B", "C", "D", "E", "F"]
    finals = []
    for method_id, sub in paper.groupby("method_id"):
        means = sub.set_index("client").loc[labels, "mean"].to_numpy() / 100
        finals.append(make_final(method_id, 0, means, clients=labels, labels=labels))
    s = seed_summary(finals, "dice_paper")
    c = compare(s, paper, {m: m for m in paper["method_id"].unique()})
    avg = c[c["client"] == "Avg"]
    assert len(avg) == 7
    assert (avg["diff"].abs() < 0.006).all()
    assert ((avg["ours_std"] - avg["paper_std"]).abs() < 0.006).all()


def test_fedlwr_std_row_and_client_map():
    paper = load_paper_table(PAPER_TABLES / "fedlwr_table1_prostate.csv")
    sites = [f"Site{i}" for i in range(1, 7)]
    letters = ["A", "B", "C", "D", "E", "F"]
    sub = paper[paper["method_id"] == "fedlwr"].set_index("client")
    final = make_final("fedlwr", 0, sub.loc[sites, "mean"].to_numpy() / 100, clients=sites, labels=letters)
    s = seed_summary([final], "dice_paper")
    with pytest.raises(ValueError, match="client_map"):
        compare(s, paper, {"fedlwr": "fedlwr"})
    c = compare(s, paper, {"fedlwr": "fedlwr"}, client_map=dict(zip(letters, sites)))
    assert list(c["client"]) == sites + ["Avg", "Std"]
    assert (c["diff"].abs() < 0.011).all()  # Std: population std of the sites, as printed


def test_compare_needs_one_metric():
    paper = load_paper_table(PAPER_TABLES / "prrfl_table2.csv")
    s = seed_summary([make_final("fedavg", 0, [0.5] * 4, metric="f1", clients=list("ABCD"), labels=list("ABCD"))], "f1")
    with pytest.raises(ValueError, match="several metrics"):
        compare(s, paper, {"fedavg": "fedavg"})
    c = compare(s, paper, {"fedavg": "fedavg"}, metric="f1")
    assert c.set_index("client").loc["A", "diff"] == pytest.approx(50.0 - 57.44)


# ------------------------------------------------------------------------------ figures


def make_history(offset):
    rows = []
    for r in (1, 2, 3):
        for client, base in (("BIDMC", 0.5), ("HK", 0.7)):
            rows.append(dict(round=r, client=client, split="test", metric="dice_paper", value=base + 0.1 * r + offset))
            rows.append(dict(round=r, client=client, split="val", metric="dice_paper", value=0.0))
    return pd.DataFrame(rows)


def test_seed_band_numbers():
    band = seed_band([make_history(0.0), make_history(0.02)], "dice_paper")
    # round 1: client means 0.7 and 0.72 -> mean 0.71, std 0.02/sqrt(2)
    assert band.loc[1, "mean"] == pytest.approx(0.71)
    assert band.loc[1, "std"] == pytest.approx(0.02 / math.sqrt(2))
    assert list(band["n_seeds"]) == [2, 2, 2]


def test_convergence_writes_png_and_pdf(tmp_path):
    hists = {"fedavg": [make_history(0.0), make_history(0.02)], "harmofl": [make_history(0.05)]}
    paths = convergence(
        hists, "dice_paper", tmp_path / "figs" / "conv", "Prostate", labels={"fedavg": "FedAvg", "harmofl": "HarmoFL"}
    )
    png, pdf, csv = (tmp_path / "figs" / f"conv.{ext}" for ext in ("png", "pdf", "csv"))
    assert paths == [png, pdf, csv]
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pdf.stat().st_size > 1000 and pdf.read_bytes()[:5] == b"%PDF-"
    assert sorted(p.name for p in png.parent.iterdir()) == ["conv.csv", "conv.pdf", "conv.png"]  # and no temporary file
    with pytest.raises(ValueError, match="run 'fedavg'.*metric='auc'"):
        convergence(hists, "auc", tmp_path / "x", "t")


def test_report_modules_do_not_import_torch():
    import subprocess

    code = (
        "import sys, fedmedbench.report.tables, fedmedbench.report.compare, "
        "fedmedbench.report.figures; sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------------------ report


def test_write_report_synthetic_warning(tmp_path, finals):
    s = seed_summary(finals, "dice_paper")
    paper = load_paper_table(write_paper_csv(tmp_path / "paper.csv"))
    comp = compare(s, paper, {"fedavg": "fedavg", "harmofl": "harmofl"})
    fig = tmp_path / "figures" / "conv.png"
    fig.parent.mkdir()
    fig.write_bytes(b"png")
    section = dict(
        title="Prostate (HarmoFL Table 1)",
        comparison=comp,
        metric_note="Dice as in the papers' code (dice_paper)",
        figure=fig,
        labels={"fedavg": "FedAvg", "harmofl": "HarmoFL"},
    )
    info = {"seeds": [0, 1], "rounds": 20}
    out = write_report([section], tmp_path / "reports" / "report.md", True, info)
    text = out.read_text()
    assert "SYNTHETIC" in text and "not comparable" in text
    assert "Seeds: 0, 1 (2 seeds)" in text and "Communication rounds: 20" in text
    assert "resources/paper_tables/" in text
    assert "| method | client | ours | paper | Δ |" in text
    assert "| FedAvg | A | 91.00 (1.41) | 90.00 (1.00) | +1.00 |" in text
    assert "| FedAvg | C | 70.00 (0.00) | 70.00 | +0.00 |" in text
    assert "| HarmoFL | A | 96.00 (1.41) | n/a | – |" in text
    # |1| + |-1.5| + |0| + |-0.17| + |90.667-91| over 5 cells = 3.0033/5
    assert "Mean |Δ| over the 5 cells that have a published number: 0.60 percentage points" in text
    assert "](../figures/conv.png)" in text

    out2 = write_report([section], tmp_path / "report_real.md", False, info)
    text2 = out2.read_text()
    assert "synthetic" not in text2.lower()
    assert "Seeds: 0, 1" in text2

    with pytest.raises(ValueError, match="rounds"):
        write_report([section], tmp_path / "r.md", False, {"seeds": [0]})
