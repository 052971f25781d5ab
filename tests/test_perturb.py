"""Weight perturbation (HarmoFL Eqs. 6-7): hand-computed step, alpha = 0 is the plain step bit for bit."""

import copy

import pytest
import torch
from torch import nn

from fedmedbench.ops.perturb import global_grad_norm, perturbation, perturbed_step


def small_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 5 * 5, 2)
    )


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 2, 5, 5, generator=g), torch.randint(0, 2, (4,), generator=g)


def plain_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
        lambda p: torch.optim.Adam(p, lr=1e-2, betas=(0.9, 0.99), weight_decay=1e-4),
    ],
)
def test_radius_zero_is_the_plain_step_bit_for_bit(make_optimizer):
    plain = small_net()
    perturbed = copy.deepcopy(plain)
    opt_plain, opt_perturbed = make_optimizer(plain.parameters()), make_optimizer(perturbed.parameters())
    for step in range(3):
        x, y = batch(step)
        loss_a = plain_step(plain, opt_plain, x, y)
        loss_b = perturbed_step(
            perturbed, lambda x=x, y=y: nn.functional.cross_entropy(perturbed(x), y), opt_perturbed, radius=0.0
        )
        assert torch.equal(loss_a, loss_b)
    for (name, a), b in zip(plain.state_dict().items(), perturbed.state_dict().values()):
        assert torch.equal(a, b), name  # weights and BN running statistics (updated once per step)
    for state_a, state_b in zip(opt_plain.state.values(), opt_perturbed.state.values()):
        for key in state_a:
            assert torch.equal(torch.as_tensor(state_a[key]), torch.as_tensor(state_b[key])), key


def test_linear_model_by_hand():
    """f(x) = w.x + b, L = mean((f - y)^2); one global norm over (w, b); gradient at theta + delta, SGD at theta."""
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 0.0], dtype=torch.float64)
    w0, b0, alpha, lr = (
        torch.tensor([0.5, -0.25], dtype=torch.float64),
        torch.tensor(0.1, dtype=torch.float64),
        0.05,
        0.1,
    )

    def grads(w, b):
        r = x @ w + b - y  # residuals
        return 2 * x.T @ r / len(y), 2 * r.mean()

    gw, gb = grads(w0, b0)
    # residuals (0.1 - 1, 1.85 - 0) = (-0.9, 1.85): gw = (4.65, -3.65), gb = 0.95
    torch.testing.assert_close(gw, torch.tensor([4.65, -3.65], dtype=torch.float64))
    norm = torch.sqrt(gw.pow(2).sum() + gb**2)
    dw, db = alpha * gw / norm, alpha * gb / norm
    gw_d, gb_d = grads(w0 + dw, b0 + db)
    expected_w, expected_b = w0 - lr * gw_d, b0 - lr * gb_d

    model = nn.Linear(2, 1).double()
    with torch.no_grad():
        model.weight.copy_(w0[None]), model.bias.copy_(b0[None])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = perturbed_step(model, lambda: (model(x).squeeze(1) - y).pow(2).mean(), optimizer, radius=alpha)
    torch.testing.assert_close(loss, ((x @ w0 + b0 - y) ** 2).mean(), rtol=0, atol=1e-15)  # loss at theta
    torch.testing.assert_close(model.weight.detach()[0], expected_w, rtol=0, atol=1e-14)
    torch.testing.assert_close(model.bias.detach()[0], expected_b, rtol=0, atol=1e-14)
    # The perturbation really mattered (the test can fail): the plain step lands elsewhere.
    assert (expected_w - (w0 - lr * gw)).abs().max() > 1e-3


def test_one_global_norm_and_zero_gradient_guard():
    g1, g2 = torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])
    assert global_grad_norm([g1, g2]).item() == 5.0
    d1, d2 = perturbation([g1, g2], 0.5)
    torch.testing.assert_close(d1, torch.tensor([0.3, 0.0]))
    torch.testing.assert_close(d2, torch.tensor([[0.4]]))  # not per layer: layer 2 alone would get 0.5
    zero = perturbation([torch.zeros(3), torch.zeros(2, 2)], 0.05)
    assert all(torch.equal(d, torch.zeros_like(d)) for d in zero)

    model = nn.Linear(3, 1)
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = perturbed_step(model, lambda: 0.0 * model(torch.ones(2, 3)).sum(), optimizer, radius=0.05)
    assert torch.isfinite(loss)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key  # zero gradient: no NaN, no move


def test_perturbed_pass_leaves_bn_statistics_and_after_backward_runs():
    model = small_net()
    reference = copy.deepcopy(model)
    x, y = batch(0)
    reference.train()
    with torch.no_grad():
        reference(x)  # one forward at theta updates the statistics once
    calls = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: only the statistics can move
    perturbed_step(
        model,
        lambda: nn.functional.cross_entropy(model(x), y),
        optimizer,
        radius=1.0,
        after_backward=lambda: calls.append(1),
    )
    assert calls == [1]
    bn, bn_ref = model[1], reference[1]
    assert torch.equal(bn.running_mean, bn_ref.running_mean) and torch.equal(bn.running_var, bn_ref.running_var)
    assert bn.num_batches_tracked.item() == 1 and bn.track_running_stats
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key  # theta restored exactly after the perturbed pass
