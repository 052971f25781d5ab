"""Bold compares only rows selected the same way: a row whose model was picked under another rule
(PRR-FL's official code: one round for all clients in the last 20 % of rounds) is another
measurement, so its Avg is never bold however high (issue: PRR-FL Table 2's official row)."""

from __future__ import annotations

from fedmedbench.report.tables import seed_summary, selection_rule, table_layout, write_table

CLIENTS = ["A", "B"]


def final(run, values, scope="per_client", window=1.0):
    return {
        "task": "skin",
        "method": run.split("-")[0],
        "run": run,
        "seed": 0,
        "clients": CLIENTS,
        "client_labels": CLIENTS,
        "selection": {
            "split": "val",
            "metric": "f1_macro",
            "per_client": scope != "pooled",
            "best_round": 3,
            "rounds": 10,
        },
        "config": {"selection_scope": scope, "selection_window": window},
        "test": {c: {"f1_macro": v} for c, v in zip(CLIENTS, values)},
    }


ROWS = [("fedavg", "FedAvg"), ("prrfl", "Ours (paper)"), ("prrfl-official", "Ours (official code)")]


def hand_made():
    # Avg: FedAvg 60.00, Ours (paper) 70.00, Ours (official code) 80.00 (selected otherwise)
    return seed_summary(
        [
            final("fedavg", [0.5, 0.7]),
            final("prrfl", [0.6, 0.8]),
            final("prrfl-official", [0.7, 0.9], scope="pooled", window=0.2),
        ],
        "f1_macro",
    )


def test_the_rule_in_words():
    assert selection_rule(final("x", [0, 0])) == "each client at its own best round on val macro F1, every round"
    assert selection_rule(final("x", [0, 0], "pooled", 0.2)) == (
        "one round for all clients (their mean) on val macro F1, the last 20 % of rounds"
    )
    assert selection_rule({"run": "x"}) is None  # a final without a selection record


def test_the_official_row_is_not_bold_and_the_best_of_the_tables_rule_is(tmp_path):
    summary = hand_made()
    layout = table_layout(summary, ROWS)
    assert layout.best == {1}  # Ours (paper), 70.00: the official row's 80.00 is not compared
    md, tex = (p.read_text() for p in write_table(summary, tmp_path / "t", ROWS, caption="T")[1:])
    assert "| Ours (official code) | 70.00 (–) | 90.00 (–) | 80.00 (14.14) |" in md  # no bold
    assert "**70.00 (14.14)**" in md and "\\textbf{70.00 (14.14)}" in tex
    assert md.count("**") == 4  # the caption and one bold Avg
    assert (
        "Note: Bold compares only rows selected the same way (each client at its own best round on val macro F1, "
        "every round); not compared: Ours (official code) (one round for all clients (their mean) on val macro F1, "
        "the last 20 % of rounds)."
    ) in md


def test_rules_given_by_the_caller_override_and_one_rule_compares_all():
    summary = hand_made()
    same = {run: "r" for run, _ in ROWS}
    layout = table_layout(summary, ROWS, rules=same)
    assert layout.best == {2} and layout.rule_notes == []  # one rule: the 80.00 is the best
    # the majority rule is the table's; a tie between rules: the first row's
    assert table_layout(
        summary, ROWS[:2] + ROWS[2:], rules={"fedavg": "a", "prrfl": "b", "prrfl-official": "b"}
    ).best == {2}
    assert table_layout(summary, ROWS[:2], rules={"fedavg": "a", "prrfl": "b"}).best == {0}
