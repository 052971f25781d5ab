"""The fairness baselines' reference codes' top-k masks (CFFL, CGSV: XinyiYS's ``mask_grad_update_by_order``
and ``mask_grad_update_by_magnitude``), shared by ``methods/cffl.py`` and ``methods/cgsv.py``.

The reference codes do not keep exactly k entries: they take the k-th largest magnitude as a
threshold and zero only the entries strictly below it, so every entry tied with the threshold passes.
With continuous updates that is k entries; with an update clipped elementwise at ±c (CFFL) every
clipped entry has magnitude exactly c, so once more than k entries reach the clip the mask keeps all of
them (on the tiny task at clip 1e-3: 0.977-0.998 of the entries instead of 0.1,
``tests/test_fair_official.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def threshold_mask(update: Mapping[str, torch.Tensor], count: int) -> dict[str, torch.Tensor]:
    """``update`` with every entry below the ``count``-th largest magnitude over all tensors together set
    to 0 (entries equal to it are kept, as the reference's ``update.abs() < threshold``). ``count`` <= 0
    keeps nothing (the reference's ``mask_order == 0`` branch); ``count`` >= the total size keeps all."""
    keys = list(update)
    magnitudes = torch.cat([update[k].detach().abs().flatten() for k in keys])
    if count <= 0:
        return {k: torch.zeros_like(v) for k, v in update.items()}
    if count >= magnitudes.numel():
        return {k: v.clone() for k, v in update.items()}
    threshold = magnitudes.topk(count).values[-1]
    return {k: torch.where(v.abs() < threshold, torch.zeros_like(v), v) for k, v in update.items()}


__all__ = ["threshold_mask"]
