"""Aggregation helpers: FedAvg invariants (methods.md 2.1) and key policies by module type."""

import pytest
import torch
from torch import nn

from fedmedbench.ops.aggregate import aggregation_weights, batchnorm_keys, weighted_average


def test_weights_sum_to_one_and_follow_sizes():
    assert aggregation_weights([10, 30], "samples") == [0.25, 0.75]
    assert aggregation_weights([10, 30, 60], "uniform") == [1 / 3] * 3
    with pytest.raises(ValueError, match="weighting"):
        aggregation_weights([1], "median")


def test_average_is_linear_and_identity_on_equal_models():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = weighted_average([a, b], [0.25, 0.75], ["w", "n"])
    assert torch.equal(out["w"], torch.tensor([2.5, 5.0]))
    assert out["n"].item() == 5 and out["n"].dtype == torch.int64  # integer counters: max, no float cast
    same = weighted_average([a, a, a], [1 / 3] * 3, ["w"])
    assert torch.allclose(same["w"], a["w"])
    single = weighted_average([b], [1.0], ["w"])
    assert torch.equal(single["w"], b["w"])  # bit for bit


def test_batchnorm_keys_found_by_type_not_name():
    model = nn.Sequential()
    model.add_module("conv", nn.Conv2d(1, 2, 3))
    model.add_module("normalizer", nn.BatchNorm2d(2))  # no "bn" in the name
    model.add_module("bn_but_not_batchnorm", nn.Linear(2, 2))
    keys = batchnorm_keys(model)
    assert keys == {
        "normalizer.weight",
        "normalizer.bias",
        "normalizer.running_mean",
        "normalizer.running_var",
        "normalizer.num_batches_tracked",
    }
