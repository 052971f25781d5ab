"""precision: bf16 runs every method's custom step under autocast; fp32 is untouched."""

import pytest
import torch

from fedmedbench.fl import engine
from fedmedbench.fl.client import autocast, batch_to_device
from tests.conftest import tiny_run_config


@pytest.mark.parametrize("method", ["harmofl", "moon"])  # the custom steps; both also run the base step
def test_bf16_runs_every_custom_step_and_stays_close_to_fp32(tmp_path, tiny_task, method):
    store, split = tiny_task
    params = {"mu": 1.0} if method == "moon" else {}
    fp32 = engine.run_training(
        tiny_run_config(store, split, method, rounds=1, method_params=params), tmp_path / "fp32", progress=False
    )
    bf16 = engine.run_training(
        tiny_run_config(store, split, method, rounds=1, method_params=params, precision="bf16"),
        tmp_path / "bf16",
        progress=False,
    )
    for client, scores in fp32["val"].items():
        assert bf16["val"][client]["dice_paper"] == pytest.approx(scores["dice_paper"], abs=0.15)


def test_autocast_is_bf16_only_when_asked():
    cpu = torch.device("cpu")
    x = torch.randn(2, 3, 4, 4)
    with autocast(cpu, "bf16"):
        assert torch.nn.functional.conv2d(x, torch.randn(2, 3, 1, 1)).dtype == torch.bfloat16
    with autocast(cpu, "fp32"):
        assert torch.nn.functional.conv2d(x, torch.randn(2, 3, 1, 1)).dtype == torch.float32
    assert batch_to_device(x, cpu, "bf16").is_contiguous(memory_format=torch.channels_last)
    permuted = torch.randn(2, 4, 4, 3).permute(0, 3, 1, 2)  # as the data loader builds batches
    assert batch_to_device(permuted, cpu, "fp32").stride() == permuted.stride()  # fp32: layout kept
