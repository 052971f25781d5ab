"""Qualitative segmentation figure (HarmoFL Fig. 4): image, ground truth, each method's prediction."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedmedbench.report.figures import plt, save_figure, set_title

FG_COLOUR = np.array([1.0, 0.2, 0.2])


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


def qualitative_figure(rows: list[dict], columns: list[tuple[str, str]], out_prefix: Path, title: str) -> list[Path]:
    """``rows``: dicts with ``label`` (e.g. "prostate / HK"), ``image``, ``truth`` and ``preds`` (run -> mask).
    ``columns``: (run, display name) for the prediction columns."""
    n_cols = 2 + len(columns)
    fig, axes = plt.subplots(len(rows), n_cols, figsize=(1.6 * n_cols, 1.7 * len(rows)), layout="constrained", squeeze=False)
    headers = ["Image", "Ground truth"] + [name for _, name in columns]
    for r, row in enumerate(rows):
        show = lambda mask: overlay(row["image"], mask, row.get("centre_slice", False))  # noqa: E731
        panels = [show(np.zeros(row["truth"].shape)), show(row["truth"])] + [show(row["preds"][run]) for run, _ in columns]
        for c, panel in enumerate(panels):
            ax = axes[r, c]
            ax.imshow(panel, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(headers[c], fontsize="small")
        axes[r, 0].set_ylabel(row["label"], fontsize="small")
    set_title(fig, title)
    return save_figure(fig, out_prefix)


def load_rows(prediction_files: dict[str, Path], task: str, clients: list[str], per_client: int = 1, centre_slice: bool = False) -> list[dict]:
    """Rows of the figure from each run's ``predictions.npz`` (same test items for every run). A
    client missing from a run's file (a federated site that kept its predictions to itself:
    ``share-predictions=false``) has no row: it is left out with a warning, not guessed."""
    arrays = {run: np.load(path) for run, path in prediction_files.items()}
    first = next(iter(arrays.values()))
    rows = []
    for client in clients:
        withheld = [run for run, a in arrays.items() if f"{client}|pred" not in a.files or f"{client}|image" not in a.files]
        if withheld:
            import logging

            logging.getLogger("fedmedbench.report").warning("qualitative figure: %s has no predictions of site %s (withheld by the site); its row is left out", ", ".join(withheld), client)
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
