"""Weight perturbation (HarmoFL Eqs. 6-7; the official ``WPOptim``, i.e. SAM's two-pass step).

For one batch: ``g = grad L(theta)``, ``delta = alpha * g / ||g||_2`` with ONE L2 norm over all trainable
parameters together (not per layer), then the gradient taken at ``theta + delta`` is applied at
``theta`` by the unchanged base optimizer (SGD, Adam, ...; weight decay, momentum and moments stay
the base optimizer's business)::

    theta <- BaseStep(theta, grad L(theta + delta))

Details (docs/reviewers/harmofl.md):
- ``||g|| = 0`` gives ``delta = 0`` (the official code divides by ``||g|| + 1e-12``, which is the same
  there and differs by ~1e-12 relative elsewhere). The guard needs no host sync.
- ``theta`` is restored by copying the saved weights back, not by ``theta + delta - delta`` (the
  official code subtracts, which is off by rounding), so ``alpha = 0`` is exactly the plain step.
- Running statistics of normalization layers (BN with ``track_running_stats``) are updated by the
  forward at ``theta`` only; the forward at ``theta + delta`` uses batch statistics and leaves the
  buffers alone (as in common SAM code). HarmoFL's own networks have stateless BN, where this is moot.
- The returned loss is the one at ``theta`` (what a plain step returns, and what the official code logs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

DEFAULT_RADIUS = 0.05


def global_grad_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """``||concat(g_1, ..., g_n)||_2`` as a 0-d tensor on the first gradient's device."""
    if not grads:
        raise ValueError("no gradients")
    device = grads[0].device
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).to(device) for g in grads]))


@torch.no_grad()
def perturbation(grads: Sequence[torch.Tensor], radius: float) -> list[torch.Tensor]:
    """``delta_p = radius * g_p / ||g||_2`` (one global norm); all zeros when ``||g|| = 0``."""
    norm = global_grad_norm(grads)
    scale = torch.where(norm > 0, radius / torch.where(norm > 0, norm, torch.ones_like(norm)), torch.zeros_like(norm))
    return [g * scale.to(g.dtype) for g in grads]


@contextmanager
def frozen_norm_statistics(model: nn.Module) -> Iterator[None]:
    """Within the block, normalization layers in training mode use batch statistics without
    updating their running statistics or ``num_batches_tracked``."""
    switched = [m for m in model.modules() if isinstance(m, _NormBase) and m.track_running_stats and m.training]
    for module in switched:
        module.track_running_stats = False
    try:
        yield
    finally:
        for module in switched:
            module.track_running_stats = True


def perturbed_step(
    model: nn.Module,
    loss_fn: Callable[[], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    radius: float = DEFAULT_RADIUS,
    after_backward: Callable[[], None] | None = None,
    params: Iterable[nn.Parameter] | None = None,
) -> torch.Tensor:
    """One weight-perturbed optimizer step; returns the (detached) loss at the unperturbed weights.

    ``loss_fn()`` runs the forward pass on the current batch and returns the scalar loss; it is
    called twice (at ``theta`` and at ``theta + delta``) on the same batch. ``params``: the
    parameters to perturb (default: every parameter of ``model`` with ``requires_grad``; those that
    got no gradient are left alone). ``after_backward`` runs between the second backward and
    ``optimizer.step()`` (a client's gradient corrections, e.g. FedProx's).
    """
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    with torch.no_grad():
        active = [p for p in params if p.grad is not None]
        saved = [p.detach().clone() for p in active]
        if active:
            for p, delta in zip(active, perturbation([p.grad for p in active], radius)):
                p.add_(delta)
    optimizer.zero_grad(set_to_none=True)
    with frozen_norm_statistics(model):
        loss_fn().backward()
    with torch.no_grad():
        for p, original in zip(active, saved):
            p.copy_(original)
    if after_backward is not None:
        after_backward()
    optimizer.step()
    return loss.detach()


__all__ = ["DEFAULT_RADIUS", "global_grad_norm", "perturbation", "frozen_norm_statistics", "perturbed_step"]
