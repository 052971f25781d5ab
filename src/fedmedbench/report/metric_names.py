"""Metric keys in words, for axes, legends and captions: a reader sees "Dice (incl. background)",
not the internal key ``dice_paper``.

The keys are the ones ``fedmedbench.metrics`` computes (``METRIC_DESCRIPTIONS`` holds the full
definitions; tests/test_figure_rules.py checks that every key there has words here). This module does
not import ``metrics`` (torch): report jobs import it.
"""

from __future__ import annotations

import re

# Short enough for a y axis (a figure 4 inches tall holds ~50 characters at 10 pt).
METRIC_LABELS = {
    "dice_paper": "Dice (incl. background)",
    "dice_fg": "foreground Dice",
    "accuracy": "accuracy",
    "f1_macro": "macro F1",
    "auc_macro": "macro AUC",
    "loss": "loss",
    "dice_regions": "mean region Dice (disc, cup)",
}
# Nested regions {label >= k} of an ordered label map (metrics.region_dice_per_sample): fundus has
# region 1 = optic disc and region 2 = optic cup; other tasks keep the generic name.
_REGIONS = {1: "optic disc", 2: "optic cup"}
_REGION_KEY = re.compile(r"dice_region(\d+)")


def metric_label(key: str) -> str:
    """Words for a metric key. A key this module does not know (a plug-in's own metric) comes back
    with its underscores turned into spaces, so no internal key reaches an axis verbatim."""
    if key in METRIC_LABELS:
        return METRIC_LABELS[key]
    region = _REGION_KEY.fullmatch(key)
    if region:
        k = int(region.group(1))
        return f"{_REGIONS[k]} Dice" if k in _REGIONS else f"Dice of labels ≥ {k}"
    return str(key).replace("_", " ")


# Every metric fedmedbench computes is a score in [0, 1] (drawn in %), except the loss.
UNBOUNDED = ("loss",)


def score_range(key: str, percent: bool = True) -> tuple[float | None, float | None]:
    """The feasible range of a metric as drawn: (0, 100) for a score in percent, (0, 1) as a
    fraction, (None, None) for an unbounded quantity (a loss). No error bar or band leaves it."""
    if str(key).startswith(UNBOUNDED):
        return (None, None)
    return (0.0, 100.0) if percent else (0.0, 1.0)


# What a sweep's `error` draws, in words for its legend, its source CSV and its caption in
# `snakemake --report` (light, so the workflow reads it too). A paper figure uses one of them for all
# its panels (HarmoFL Fig. 5b and 5c: clients_sem, config.yaml).
SWEEP_ERRORS = {
    "seeds": "std over seeds of the mean over clients",
    "clients_std": "std across clients (the table's Avg parenthesis)",
    "clients_sem": "standard error across clients (std / √clients)",
}
