"""Weighted averages over state dicts and the key policies methods declare.

Key policies are decided by module type (BatchNorm layers are found with ``isinstance``), never by
matching names such as "bn", so a renamed layer cannot silently change what is shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

StateDict = dict[str, torch.Tensor]


def batchnorm_keys(model: nn.Module) -> set[str]:
    """Every state-dict key (affine parameters and running statistics) of a batch-norm layer."""
    keys = set()
    for module_name, module in model.named_modules():
        if isinstance(module, _NormBase):
            prefix = f"{module_name}." if module_name else ""
            keys.update(prefix + name for name, _ in module.named_parameters(recurse=False))
            keys.update(prefix + name for name, _ in module.named_buffers(recurse=False))
    return keys


def buffer_keys(model: nn.Module) -> set[str]:
    return {name for name, _ in model.named_buffers()}


def parameter_keys(model: nn.Module) -> set[str]:
    return {name for name, _ in model.named_parameters()}


def aggregation_weights(num_samples: Sequence[int], weighting: str) -> list[float]:
    """p_k: ``uniform`` (1/K, what HarmoFL, FedBN and Fed-LWR code use) or ``samples`` (n_k / sum n)."""
    if weighting == "uniform":
        return [1.0 / len(num_samples)] * len(num_samples)
    if weighting == "samples":
        total = float(sum(num_samples))
        return [n / total for n in num_samples]
    raise ValueError(f"unknown aggregation weighting {weighting!r}; expected 'uniform' or 'samples'")


def weighted_average(states: Sequence[StateDict], weights: Sequence[float], keys: Iterable[str]) -> StateDict:
    """sum_k w_k * state_k[key] for floating tensors; integer counters (num_batches_tracked) take the max.

    Sums are formed in the tensors' own dtype, in client order, so one client with weight 1.0 gives
    back its tensors bit for bit (FedAvg with K=1 equals local training).
    """
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    averaged = {}
    for key in keys:
        tensors = [state[key] for state in states]
        if tensors[0].is_floating_point():
            total = tensors[0] * weights[0]
            for tensor, weight in zip(tensors[1:], weights[1:]):
                total = total + tensor * weight
            averaged[key] = total
        else:
            averaged[key] = torch.stack(tensors).max(dim=0).values
    return averaged


def layer_of_keys(keys: Iterable[str]) -> dict[str, str]:
    """The layer (owning module) of each state-dict key: ``encoders.0.1.running_mean`` ->
    ``encoders.0.1``. Every tensor of a module (weight, bias, BN statistics) shares its layer."""
    return {key: key.rpartition(".")[0] for key in keys}


def layerwise_weighted_average(
    states: Sequence[StateDict],
    weights_per_layer: Mapping[str, Sequence[float]],
    layer_of_key: Mapping[str, str],
    keys: Iterable[str],
    default_weights: Sequence[float] | None = None,
) -> StateDict:
    """sum_k w_k^(layer) * state_k[key], with the weights of the key's layer (Fed-LWR Eq. 6).

    ``weights_per_layer[layer]`` holds one weight per state; a key whose layer has no entry uses
    ``default_weights`` (an error when none is given). Integer counters take the max, as in
    :func:`weighted_average`; sums are formed as there, so equal per-layer weights give exactly
    ``weighted_average`` with those weights.
    """
    averaged = {}
    for key in keys:
        layer = layer_of_key.get(key)
        weights = weights_per_layer.get(layer, default_weights) if layer is not None else default_weights
        if weights is None:
            raise KeyError(f"no aggregation weights for key {key!r} (layer {layer!r})")
        averaged.update(weighted_average(states, weights, [key]))
    return averaged


def clone_state(state: StateDict) -> StateDict:
    return {key: value.detach().clone() for key, value in state.items()}


@torch.no_grad()
def add_to_parameters(model: nn.Module, delta: Mapping[str, torch.Tensor]) -> None:
    """Adds ``delta[name]`` to each named parameter in place (a reward or a download in delta form)."""
    for name, param in model.named_parameters():
        param.add_(delta[name].to(param.device))
