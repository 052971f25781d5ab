"""HarmoFL Fig. 8: each client's images before and after amplitude normalization.

The target is the federation's average amplitude: the mean over clients of each client's mean
amplitude spectrum over (up to) ``max_images`` training images, as HarmoFL shares it after round 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedmedbench.data.store import open_client, read_split_csv
from fedmedbench.ops.fourier import amplitude_normalize, batch_mean_amplitude
from fedmedbench.report.figures import plt, save_figure, set_title


def client_images(store: Path, split_csv: Path, client: str, count: int) -> torch.Tensor:
    split = read_split_csv(split_csv)
    rows = split[(split["client"] == client) & (split["split"] == "train")]["row"].to_numpy()[:count]
    images = np.asarray(open_client(store, client).images[np.sort(rows)])
    return torch.from_numpy(images).permute(0, 3, 1, 2).double()


def normalized_examples(store: Path, split_csv: Path, clients: list[str], mode: str = "full", max_images: int = 32) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(client, first train image, that image amplitude-normalized to the federation average)."""
    batches = {c: client_images(store, split_csv, c, max_images) for c in clients}
    target = torch.stack([batch_mean_amplitude(b, mode) for b in batches.values()]).mean(0)
    out = []
    for client, batch in batches.items():
        after = amplitude_normalize(batch[:1], target, mode)[0]
        to_hwc = lambda t: t.permute(1, 2, 0).clamp(0, 255).round().to(torch.uint8).numpy()  # noqa: E731
        out.append((client, to_hwc(batch[0]), to_hwc(after)))
    return out


def ampnorm_figure(panels: dict[str, list[tuple[str, np.ndarray, np.ndarray]]], out_prefix: Path, title: str) -> list[Path]:
    """Rows: per task, 'original' then 'AmpNorm'; columns: clients."""
    n_cols = max(len(v) for v in panels.values())
    fig, axes = plt.subplots(2 * len(panels), n_cols, figsize=(1.7 * n_cols, 3.6 * len(panels)), layout="constrained", squeeze=False)
    for t, (task, examples) in enumerate(panels.items()):
        for c in range(n_cols):
            for r in range(2):
                ax = axes[2 * t + r, c]
                ax.set_xticks([])
                ax.set_yticks([])
                if c >= len(examples):
                    ax.axis("off")
                    continue
                client, before, after = examples[c]
                ax.imshow(before if r == 0 else after)
                if r == 0:
                    ax.set_title(client, fontsize="small")
            axes[2 * t, 0].set_ylabel(f"{task}\noriginal", fontsize="small")
            axes[2 * t + 1, 0].set_ylabel(f"{task}\nAmpNorm", fontsize="small")
    set_title(fig, title)
    return save_figure(fig, out_prefix)
