"""Fed-LWR's minibatch CKA with batches too small for the unbiased HSIC is refused before training.

The official code's unbiased HSIC (numpee's ``hsic1``) divides by n(n-3) and n-2: n = 2 raises, n = 1 and
3 give inf/NaN. Our minibatch estimator needs a task ``batch_size`` of at least 4; the paper row's
data-set Grams do not depend on the batch size."""

from __future__ import annotations

import pytest
import torch

from fedmedbench.errors import ConfigError
from fedmedbench.methods import fedlwr
from tests.conftest import build_federation, tiny_run_config
from tests.test_fedlwr_official import write_task


def official_hsic1(K: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """``CKACalculator.hsic1`` of Fed-LWR's cka.py (numpee/CKA.pytorch), batched B x n x n, as written."""
    K, L = K.clone(), L.clone()
    n = K.size(1)
    K.diagonal(dim1=-1, dim2=-2).fill_(0)
    L.diagonal(dim1=-1, dim2=-2).fill_(0)
    KL = torch.bmm(K, L)
    trace_KL = KL.diagonal(dim1=-1, dim2=-2).sum(-1).unsqueeze(-1).unsqueeze(-1)
    middle_term = K.sum((-1, -2), keepdim=True) * L.sum((-1, -2), keepdim=True)
    middle_term /= (n - 1) * (n - 2)  # a tensor divided by 0: inf/NaN, no error
    right_term = KL.sum((-1, -2), keepdim=True)
    right_term *= 2 / (n - 2)  # Python's 2 / 0: ZeroDivisionError
    main_term = trace_KL + middle_term - right_term
    return (main_term / (n**2 - 3 * n)).squeeze(-1).squeeze(-1)


def test_what_the_official_hsic_does_for_each_small_n():
    def gram(n):
        x = torch.arange(1.0, 3 * n + 1).reshape(1, n, 3)
        return torch.bmm(x, x.transpose(1, 2))

    with pytest.raises(ZeroDivisionError):
        official_hsic1(gram(2), gram(2))
    for n in (1, 3):
        assert not torch.isfinite(official_hsic1(gram(n), gram(n))).all()
    assert torch.isfinite(official_hsic1(gram(4), gram(4))).all()


@pytest.mark.parametrize("variant", [{"official_numerics": True}, {"gram": "minibatch"}])
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_minibatch_cka_with_batches_under_four_is_refused_before_training(tmp_path, variant, batch):
    store, split, _ = write_task(tmp_path / "data")
    cfg = tiny_run_config(store, split, "fedlwr", batch_size=batch, method_params=variant)
    with pytest.raises(
        ConfigError,
        match=rf"tasks\.tiny\.batch_size: fedlwr's minibatch CKA .* needs batches of at least 4 samples .*got {batch}$",
    ):
        build_federation(fedlwr, cfg)


def test_batches_of_four_and_the_paper_rows_data_set_grams_are_accepted(tmp_path):
    store, split, _ = write_task(tmp_path / "data")
    build_federation(fedlwr, tiny_run_config(store, split, "fedlwr", batch_size=4, method_params={"gram": "minibatch"}))
    build_federation(fedlwr, tiny_run_config(store, split, "fedlwr", batch_size=2))  # gram: dataset
