"""Linear CKA: identities, invariances, a numpy closed form, minibatch accumulation, hooks by name."""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedmedbench.ops.aggregate import layer_of_keys, layerwise_weighted_average, weighted_average
from fedmedbench.ops.cka import (
    MinibatchCKA,
    cka_batches,
    cka_from_grams,
    dataset_grams,
    hsic_unbiased,
    layerwise_cka_weights,
    layerwise_similarity,
    linear_cka,
    matched_layers,
)


def features(n=40, p=12, q=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, p, generator=g, dtype=torch.float64)
    y = x @ torch.randn(p, q, generator=g, dtype=torch.float64) + 0.5 * torch.randn(
        n, q, generator=g, dtype=torch.float64
    )
    return x, y


def orthogonal(d, seed):
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


@pytest.mark.parametrize("unbiased", [True, False])
def test_cka_of_a_matrix_with_itself_is_one(unbiased):
    x, _ = features()
    assert linear_cka(x, x, unbiased) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("unbiased", [True, False])
def test_invariant_to_orthogonal_transforms_and_isotropic_scaling(unbiased):
    x, y = features()
    base = linear_cka(x, y, unbiased)
    assert 0.1 < base < 1.0
    assert linear_cka(x @ orthogonal(12, 1), y, unbiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(x, y @ orthogonal(9, 2), unbiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(3.7 * x, y, unbiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(x, 0.01 * y, unbiased) == pytest.approx(base, abs=1e-12)


def numpy_unbiased_hsic(K, L):
    """Song et al. 2012 Eq. 5, written out with explicit loops over the definition's pieces."""
    n = K.shape[0]
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0)
    np.fill_diagonal(L, 0)
    one = np.ones(n)
    return (
        np.trace(K @ L) + (one @ K @ one) * (one @ L @ one) / ((n - 1) * (n - 2)) - 2 / (n - 2) * (one @ K @ L @ one)
    ) / (n * (n - 3))


def test_agrees_with_numpy_closed_forms():
    x, y = features(n=17)
    X, Y = x.numpy(), y.numpy()
    K, L = X @ X.T, Y @ Y.T
    expected_u = numpy_unbiased_hsic(K, L) / math.sqrt(numpy_unbiased_hsic(K, K) * numpy_unbiased_hsic(L, L))
    assert linear_cka(x, y, unbiased=True) == pytest.approx(expected_u, rel=1e-10)
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    expected_b = np.linalg.norm(Yc.T @ Xc) ** 2 / (np.linalg.norm(Xc.T @ Xc) * np.linalg.norm(Yc.T @ Yc))
    assert linear_cka(x, y, unbiased=False) == pytest.approx(expected_b, rel=1e-10)
    # biased CKA = HSIC on centred Grams (the kernel form)
    H = np.eye(17) - 1 / 17
    Kc, Lc = H @ K @ H, H @ L @ H
    assert expected_b == pytest.approx(np.sum(Kc * Lc) / np.sqrt(np.sum(Kc * Kc) * np.sum(Lc * Lc)), rel=1e-10)


def test_unbiased_hsic_needs_four_samples():
    with pytest.raises(ValueError, match="at least 4"):
        hsic_unbiased(torch.eye(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.out = nn.Conv2d(4, 3, 1)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.conv(x))))


def pair(seed=0):
    torch.manual_seed(seed)
    a = Tiny().eval()
    b = copy.deepcopy(a)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return a, b


def test_minibatch_estimate_approaches_full_batch_as_batches_grow():
    a, b = pair()
    x = torch.randn(256, 2, 6, 6, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = linear_cka(a.conv(x), b.conv(x))
    errors = []
    for batch in (8, 32, 128):
        meter = MinibatchCKA(a, b, layers=["conv"])
        for idx in cka_batches(len(x), batch):
            meter.update(x[idx.start : idx.stop])
        errors.append(abs(meter.compute()["conv"] - full))
    meter = MinibatchCKA(a, b, layers=["conv"], gram_dtype=torch.float64)
    meter.update(x)
    assert meter.compute()["conv"] == pytest.approx(full, abs=1e-10)  # one batch = the full-batch value
    fast = MinibatchCKA(a, b, layers=["conv"])  # float32 Gram of centred features
    fast.update(x)
    assert fast.compute()["conv"] == pytest.approx(full, abs=1e-5)
    assert errors[2] < errors[0]
    assert errors[2] < 0.02


def test_minibatch_cka_of_a_model_with_itself_is_one_on_every_layer():
    a, _ = pair()
    x = torch.randn(20, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    sims, skipped = layerwise_similarity(a, copy.deepcopy(a), [x[:8], x[8:16], x[16:]], "cka")
    assert skipped == 0 and list(sims) == ["conv", "bn", "out"]
    assert all(v == pytest.approx(1.0, abs=1e-10) for v in sims.values())
    cos, _ = layerwise_similarity(a, copy.deepcopy(a), [x], "cosine")
    assert all(v == pytest.approx(1.0, abs=1e-10) for v in cos.values())


def test_small_minibatches_are_merged_or_skipped():
    assert [len(r) for r in cka_batches(10, 8)] == [10]
    assert [len(r) for r in cka_batches(12, 8)] == [8, 4]
    assert [len(r) for r in cka_batches(3, 8)] == [3]
    a, b = pair()
    x = torch.randn(3, 2, 5, 5)
    sims, skipped = layerwise_similarity(a, b, [x], "cka")
    assert skipped == 1 and all(math.isnan(v) for v in sims.values())


def test_layers_matched_by_name_not_position():
    a, b = pair()

    class Reordered(nn.Module):  # same names, registered in another order
        def __init__(self, src):
            super().__init__()
            self.out, self.bn, self.conv = src.out, src.bn, src.conv

        def forward(self, x):
            return self.out(torch.relu(self.bn(self.conv(x))))

    x = torch.randn(16, 2, 5, 5, generator=torch.Generator().manual_seed(2))
    straight, _ = layerwise_similarity(a, b, [x])
    reordered, _ = layerwise_similarity(a, Reordered(b).eval(), [x])
    assert reordered == pytest.approx(straight, abs=1e-12)
    with pytest.raises(ValueError, match="not a module of both"):
        matched_layers(a, nn.Sequential(nn.Conv2d(2, 4, 3)))


def test_hooks_are_removed_and_modes_restored():
    a, b = pair()
    a.train()
    layerwise_similarity(a, b, [torch.randn(8, 2, 4, 4)])
    assert a.training and not b.training
    assert all(not m._forward_hooks for m in list(a.modules()) + list(b.modules()))


def test_official_numerics_switch_reproduces_the_epsilon_clip():
    a, b = pair()
    x = torch.randn(16, 2, 5, 5, generator=torch.Generator().manual_seed(4))
    ours, _ = layerwise_similarity(a, b, [x], "cka")
    official, _ = layerwise_similarity(a, b, [x], "cka", official=True)
    assert set(official) == set(ours)
    # each minibatch HSIC is scaled by 1e-4 before the clip at 1e-4: small layers collapse towards 0
    assert any(abs(official[k] - ours[k]) > 0.1 for k in ours)


def test_layerwise_weighted_average_uses_each_layers_weights():
    s1 = {
        "a.weight": torch.ones(2),
        "a.bias": torch.ones(1),
        "b.running_mean": torch.ones(2),
        "b.num_batches_tracked": torch.tensor(3),
    }
    s2 = {k: 3 * v for k, v in s1.items()}
    layers = layer_of_keys(s1)
    assert layers["b.running_mean"] == "b"
    out = layerwise_weighted_average([s1, s2], {"a": [0.25, 0.75], "b": [1.0, 0.0]}, layers, s1)
    assert torch.allclose(out["a.weight"], torch.full((2,), 2.5)) and torch.allclose(out["a.bias"], torch.tensor([2.5]))
    assert torch.allclose(out["b.running_mean"], torch.ones(2)) and int(out["b.num_batches_tracked"]) == 9
    same = layerwise_weighted_average([s1, s2], {"a": [0.5, 0.5], "b": [0.5, 0.5]}, layers, s1)
    ref = weighted_average([s1, s2], [0.5, 0.5], s1)
    assert all(torch.equal(same[k], ref[k]) for k in s1)


# --- Eq. 2 as printed: data-set Grams --------------------------------------------------------------
def all_outputs(model, x, layer):
    """The layer's flattened outputs for every sample at once (the definition, no blocks)."""
    out = {}

    def keep(module, inputs, output):
        out["x"] = output.detach().flatten(1).clone()

    handle = dict(model.named_modules())[layer].register_forward_hook(keep)
    with torch.no_grad():
        model(x)
    handle.remove()
    return out["x"].double().numpy()


def centred_gram(U):
    n = len(U)
    H = np.eye(n) - 1 / n
    return H @ (U @ U.T) @ H


@pytest.mark.parametrize("block", [1, 3, 7, 50])
def test_dataset_grams_are_the_centred_grams_of_the_whole_data_set_for_any_block(block):
    a, _ = pair()
    a.double()  # float64 forwards: outputs that do not depend on how the samples are batched
    x = torch.randn(7, 2, 5, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 3.0  # a large mean
    grams = dataset_grams(
        a, lambda s, e: x[s:e], len(x), ["conv", "bn", "out"], batch_size=2, block=block, gram_dtype=torch.float64
    )
    for layer in ("conv", "bn", "out"):
        expected = centred_gram(all_outputs(a, x, layer))
        assert np.allclose(grams[layer].numpy(), expected, rtol=1e-10, atol=1e-10), layer
    fast = dataset_grams(
        a, lambda s, e: x[s:e], len(x), ["conv"], batch_size=2, block=block
    )  # float32 Grams of shifted outputs
    assert np.allclose(fast["conv"].numpy(), centred_gram(all_outputs(a, x, "conv")), rtol=1e-5, atol=1e-5)
    assert a.training is False and not any(m._forward_hooks for m in a.modules())


def test_cka_from_grams_is_eq2_biased_hsic_of_centred_grams():
    a, b = pair()
    a.double()
    b.double()
    x = torch.randn(9, 2, 5, 5, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    load = lambda s, e: x[s:e]  # noqa: E731
    ga = dataset_grams(a, load, 9, ["conv"], batch_size=4, gram_dtype=torch.float64)["conv"]
    gb = dataset_grams(b, load, 9, ["conv"], batch_size=4, gram_dtype=torch.float64)["conv"]
    Kc, Lc = centred_gram(all_outputs(a, x, "conv")), centred_gram(all_outputs(b, x, "conv"))
    hsic = lambda P, Q: P.flatten() @ Q.flatten() / (9 - 1) ** 2  # noqa: E731  vec(K')·vec(L')/(n-1)²
    expected = hsic(Kc, Lc) / np.sqrt(hsic(Kc, Kc) * hsic(Lc, Lc))
    assert 0.2 < expected < 0.99
    assert cka_from_grams(ga, gb) == pytest.approx(expected, rel=1e-10)
    # the unbiased HSIC on the same Grams is a different number (the official estimator)
    assert abs(cka_from_grams(ga, gb, unbiased=True) - expected) > 1e-3
    assert math.isnan(cka_from_grams(ga[:1, :1], gb[:1, :1]))


def test_official_weights_add_1e9_to_the_denominator():
    sims = [{"l": 0.5}, {"l": 0.9}]
    plain, official = layerwise_cka_weights(sims)["l"], layerwise_cka_weights(sims, eps=1e-9)["l"]
    assert plain == pytest.approx([0.5 / 0.6, 0.1 / 0.6], rel=1e-14)
    assert official == pytest.approx([0.5 / (0.6 + 1e-9), 0.1 / (0.6 + 1e-9)], rel=1e-14)
    assert sum(plain) == pytest.approx(1.0, abs=1e-15) and 1.0 - sum(official) == pytest.approx(1e-9 / 0.6, rel=1e-6)
