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
from fedmedbench.report.figures import SourceData, finish, plt, set_title


def client_images(store: Path, split_csv: Path, client: str, count: int) -> torch.Tensor:
    split = read_split_csv(split_csv)
    rows = split[(split["client"] == client) & (split["split"] == "train")]["row"].to_numpy()[:count]
    images = np.asarray(open_client(store, client).images[np.sort(rows)])
    return torch.from_numpy(images).permute(0, 3, 1, 2).double()


def normalized_examples(
    store: Path, split_csv: Path, clients: list[str], mode: str = "full", max_images: int = 32
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(client, first train image, that image amplitude-normalized to the federation average)."""
    batches = {c: client_images(store, split_csv, c, max_images) for c in clients}
    target = torch.stack([batch_mean_amplitude(b, mode) for b in batches.values()]).mean(0)
    out = []
    for client, batch in batches.items():
        after = amplitude_normalize(batch[:1], target, mode)[0]
        to_hwc = lambda t: t.permute(1, 2, 0).clamp(0, 255).round().to(torch.uint8).numpy()  # noqa: E731
        out.append((client, to_hwc(batch[0]), to_hwc(after)))
    return out


def shown_image(image: np.ndarray, centre_slice: bool) -> np.ndarray:
    """What a panel shows: the image, or for 2.5D MRI (channels = adjacent slices) its middle slice,
    drawn in grey; three slices as RGB would be false colour."""
    return image[..., image.shape[-1] // 2] if centre_slice and image.ndim == 3 else image


def ampnorm_figure(
    panels: dict[str, list[tuple[str, np.ndarray, np.ndarray]]],
    out_prefix: Path,
    title: str,
    centre_slice: set[str] | frozenset = frozenset(),
    synthetic: bool = False,
) -> list[Path]:
    """Rows: per task, 'original' then 'AmpNorm'; columns: clients. Tasks in ``centre_slice`` show
    the middle slice in grey. The source CSV has one row per image panel: its mean intensity
    (0-255) and the range of its pixels."""
    n_cols = max(len(v) for v in panels.values())
    fig, axes = plt.subplots(
        2 * len(panels), n_cols, figsize=(1.7 * n_cols, 3.6 * len(panels)), layout="constrained", squeeze=False
    )
    source = SourceData((0.0, 255.0))
    for t, (task, examples) in enumerate(panels.items()):
        grey = task in centre_slice
        for c in range(n_cols):
            for r in range(2):
                ax = axes[2 * t + r, c]
                ax.set_xticks([])
                ax.set_yticks([])
                if c >= len(examples):
                    ax.axis("off")
                    continue
                client, before, after = examples[c]
                image = shown_image(before if r == 0 else after, grey)
                if image.ndim == 2:
                    ax.imshow(image, cmap="gray", vmin=0, vmax=255)
                else:
                    ax.imshow(image)
                if r == 0:
                    ax.set_title(client, fontsize="small")
                row = "original" if r == 0 else "AmpNorm"
                source.add(
                    f"{task} {row}",
                    client,
                    float(image.mean()),
                    kind="panel",
                    n=int(image.size),
                    n_of="pixel values (mean intensity, 0-255)",
                )
            shown = "\n(middle slice, grey)" if grey else ""
            axes[2 * t, 0].set_ylabel(f"{task}\noriginal{shown}", fontsize="small")
            axes[2 * t + 1, 0].set_ylabel(f"{task}\nAmpNorm{shown}", fontsize="small")
    set_title(fig, title)
    return finish(fig, out_prefix, source, synthetic)
