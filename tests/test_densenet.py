"""DenseNet-121 adapted to 96x96 patches (HarmoFL's Camelyon17 network)."""

import math

import pytest
import torch
from torch import nn

from fedmedbench.models import build_model
from fedmedbench.models.densenet import DenseNet121


@pytest.fixture(scope="module")
def standard():
    torch.manual_seed(0)
    return build_model({"name": "densenet", "num_classes": 2, "bn": "standard"})


def test_shapes_on_96px_input(standard):
    x = torch.rand(2, 3, 96, 96)
    standard.eval()
    with torch.no_grad():
        assert standard(x).shape == (2, 2)
        assert standard.embed(x).shape == (2, 1024)
        # The zero padding after dense block 1 (HarmoFL's change): 24x24 -> 28x28 before transition 1.
        names = [name for name, _ in standard.features.named_children()]
        assert names[names.index("denseblock1") + 1] == "zero_padding"
        stem = standard.features[:5](x)
        assert stem.shape[-2:] == (24, 24) and standard.features.zero_padding(stem).shape[-2:] == (28, 28)
        torch.testing.assert_close(standard.classifier(standard.embed(x)), standard(x))


def test_kaiming_init_and_densenet121_size(standard):
    conv = standard.features.denseblock3.denselayer7.conv1
    fan_in = conv.weight[0].numel()
    assert abs(conv.weight.std().item() - math.sqrt(2 / fan_in)) < 0.1 * math.sqrt(2 / fan_in)
    assert torch.count_nonzero(standard.classifier.bias) == 0
    assert sum(p.numel() for p in standard.parameters()) == 6_955_906  # torchvision densenet121, 2 classes
    assert any(isinstance(m, nn.BatchNorm2d) and m.affine and m.track_running_stats for m in standard.modules())


def test_stateless_bn_has_no_buffers_and_no_bn_parameters():
    model = DenseNet121(bn="stateless")
    assert list(model.buffers()) == []
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 121  # 2 per dense layer (58 layers), 3 transitions, norm0, norm5
    assert all(not m.affine and not m.track_running_stats for m in bns)
    assert sum(p.numel() for p in model.parameters()) == 6_872_258  # the 83,648 BN affine values are gone
    model.eval()  # batch statistics at test time too
    x = torch.rand(3, 3, 96, 96)
    with torch.no_grad():
        assert model(x).shape == (3, 2) and model.embed(x).shape == (3, 1024)


def test_options():
    assert DenseNet121(in_channels=1).features.conv0.in_channels == 1
    with pytest.raises(ValueError):
        DenseNet121(bn="group")
