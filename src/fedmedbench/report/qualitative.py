"""Qualitative segmentation figure (HarmoFL Fig. 4): image, ground truth, each method's prediction."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from matplotlib.patches import Patch

from fedmedbench.report.figures import SourceData, finish, plt, set_title
from fedmedbench.report.metric_names import metric_label

FG_COLOUR = np.array([1.0, 0.2, 0.2])
OVERLAY_KEY = "red tint: foreground (ground truth, or the method's prediction)"


def foreground_dice(pred: np.ndarray, truth: np.ndarray) -> float:
    """Foreground Dice (%) of one panel: 2|P ∩ T| / (|P| + |T|) over pixels > 0; NaN when neither
    has foreground (undefined, not 100 %)."""
    p, t = np.asarray(pred) > 0, np.asarray(truth) > 0
    total = int(p.sum() + t.sum())
    return 100.0 * 2.0 * float((p & t).sum()) / total if total else float("nan")


def overlay(image: np.ndarray, mask: np.ndarray, centre_slice: bool = False) -> np.ndarray:
    """RGB image in [0, 1] with the foreground tinted, so boundaries are easy to compare.
    ``centre_slice``: the channels are adjacent MR slices (2.5D); show the middle one in grey."""
    rgb = image.astype(float) / 255.0
    if rgb.ndim == 2:
        rgb = rgb[..., None]
    if centre_slice or rgb.shape[-1] == 1:
        base = np.repeat(rgb[..., rgb.shape[-1] // 2 : rgb.shape[-1] // 2 + 1], 3, axis=-1)
    else:
        base = rgb
    out = base.copy()
    fg = mask > 0
    out[fg] = 0.55 * base[fg] + 0.45 * FG_COLOUR
    return out


def qualitative_figure(
    rows: list[dict], columns: list[tuple[str, str]], out_prefix: Path, title: str, synthetic: bool = False
) -> list[Path]:
    """``rows``: dicts with ``label`` (e.g. "prostate / HK"), ``image``, ``truth`` and ``preds`` (run -> mask).
    ``columns``: (run, display name) for the prediction columns. Under each prediction its
    foreground Dice against the ground truth; a key below says what the red tint is."""
    n_cols = 2 + len(columns)
    fig, axes = plt.subplots(
        len(rows), n_cols, figsize=(1.6 * n_cols, 1.85 * len(rows)), layout="constrained", squeeze=False
    )
    headers = ["Image", "Ground truth"] + [name for _, name in columns]
    source = SourceData((0.0, 100.0))
    for r, row in enumerate(rows):
        show = lambda mask, row=row: overlay(row["image"], mask, row.get("centre_slice", False))  # noqa: E731
        panels = [show(np.zeros(row["truth"].shape)), show(row["truth"])] + [
            show(row["preds"][run]) for run, _ in columns
        ]
        for c, panel in enumerate(panels):
            ax = axes[r, c]
            ax.imshow(panel, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(headers[c], fontsize="small")
            if c >= 2:  # a prediction: its score on this image
                dice = foreground_dice(row["preds"][columns[c - 2][0]], row["truth"])
                # named as the tables name it (report.metric_names): the tables' "Dice" includes background
                ax.set_xlabel(
                    "no foreground" if np.isnan(dice) else f"{metric_label('dice_fg')} {dice:.1f} %", fontsize="x-small"
                )
                source.add(
                    headers[c], row["label"], dice, kind="panel", n=1, n_of="image (foreground Dice vs ground truth)"
                )
            else:
                source.add(headers[c], row["label"], np.nan, kind="panel", n=1, n_of="image")
        axes[r, 0].set_ylabel(row["label"], fontsize="small")
    grey = any(row.get("centre_slice") for row in rows)
    key = OVERLAY_KEY + ("; MRI: the middle of its 3 adjacent slices, in grey" if grey else "")
    fig.legend(
        handles=[Patch(facecolor=FG_COLOUR, alpha=0.45, edgecolor="none", label=key)],
        loc="outside lower center",
        frameon=False,
        fontsize="small",
    )
    set_title(fig, title)
    return finish(fig, out_prefix, source, synthetic)


def load_rows(
    prediction_files: dict[str, Path], task: str, clients: list[str], per_client: int = 1, centre_slice: bool = False
) -> list[dict]:
    """Rows of the figure from each run's ``predictions.npz`` (same test items for every run). A
    client missing from a run's file (a federated site that kept its predictions to itself:
    ``share-predictions=false``) has no row: it is left out with a warning, not guessed."""
    arrays = {run: np.load(path) for run, path in prediction_files.items()}
    first = next(iter(arrays.values()))
    rows = []
    for client in clients:
        withheld = [
            run for run, a in arrays.items() if f"{client}|pred" not in a.files or f"{client}|image" not in a.files
        ]
        if withheld:
            logging.getLogger("fedmedbench.report").warning(
                "qualitative figure: %s has no predictions of site %s (withheld by the site); its row is left out",
                ", ".join(withheld),
                client,
            )
            continue
        for i in range(min(per_client, len(first[f"{client}|image"]))):
            rows.append(
                {
                    "label": f"{task} / {client}",
                    "image": first[f"{client}|image"][i],
                    "truth": first[f"{client}|label"][i],
                    "preds": {run: a[f"{client}|pred"][i] for run, a in arrays.items()},
                    "centre_slice": centre_slice,
                }
            )
    return rows
