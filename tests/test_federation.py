"""Flower's deployment runtime computes what the engine computes (fedmedbench.federation).

The codec tests check that a method's payloads cross Flower's records bit for bit and that a bad
reply is refused in one line naming the site. The slow ones run the first half of the equivalence
matrix (tests/federation_matrix.py: the HarmoFL paper's baselines and the other built-ins outside
PRR-FL and Fed-LWR) on one real federation, 2 rounds each, and compare each run folder with the
engine's byte for byte; tests/test_federation_prrfl_fedlwr.py runs the rest. Skipped where the
``flower`` extra is not installed."""

import math

import pytest
import torch

flwr = pytest.importorskip("flwr")

from fedmedbench.federation.messages import check_reply, pack, unpack  # noqa: E402
from fedmedbench.fl.rounds import SiteError  # noqa: E402
from tests.federation_matrix import FIRST_HALF, MATRIX, assert_equals_the_engine, federated_runs  # noqa: E402


def test_payloads_cross_flower_records_bit_for_bit():
    state = {
        "w": torch.randn(3, 4),
        "bn.num_batches_tracked": torch.tensor(7),
        "idx": torch.arange(5, dtype=torch.int32),
        "h": torch.randn(2).half(),
    }
    value = {"state": state, "num_samples": 12, "steps": 3, "loss": 0.1 + 0.2, "scores": {"dice": 1 / 3, "loss": math.pi},
             "nested": {"deputy": {"w": torch.ones(2)}, "stage": "det"}, "nothing": None, "flag": True, "bf": torch.randn(2).bfloat16()}  # fmt: skip
    back = unpack(pack(value, round=2), "test")
    assert list(back) == list(value)
    for key, tensor in state.items():
        assert (
            back["state"][key].dtype == tensor.dtype
            and back["state"][key].shape == tensor.shape
            and torch.equal(back["state"][key], tensor)
        ), key
    assert back["num_samples"] == 12 and type(back["num_samples"]) is int and back["loss"] == 0.1 + 0.2
    assert back["scores"] == {"dice": 1 / 3, "loss": math.pi}
    assert torch.equal(back["nested"]["deputy"]["w"], torch.ones(2)) and back["nested"]["stage"] == "det"
    assert back["nothing"] is None and back["flag"] is True and torch.equal(back["bf"], value["bf"])
    assert unpack(pack(None), "test") is None
    # The state travels as an ArrayRecord, the scores as a MetricRecord (not pickled bytes).
    records = pack(value)
    assert isinstance(records["a:state"], flwr.app.ArrayRecord) and isinstance(
        records["s:scores"], flwr.app.MetricRecord
    )


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch, reading the pickled object it then refuses
def test_a_pickled_object_is_refused_naming_the_site():
    records = pack({"x": 1})
    records["b"]["evil"] = __import__("pickle").dumps(SiteError("code"))
    records["kind"]["order"] = ["x", "evil"]
    records["kind"]["types"] = ["int", "SiteError"]
    with pytest.raises(SiteError, match="site B: a payload that is not plain tensors"):
        unpack(records, "site B")


@pytest.mark.parametrize(
    "reply, message",
    [
        ({"state": {"w": torch.tensor([1.0, float("nan")])}, "num_samples": 3}, "site A: tensor 'w' is not finite"),
        ({"state": {"w": torch.zeros(3)}, "num_samples": 3}, r"site A: tensor 'w' is \(3,\)"),
        ({"state": {"v": torch.zeros(2)}, "num_samples": 3}, "site A: the reply holds tensor 'v'"),
        ({"state": {"w": torch.zeros(2)}, "num_samples": 0}, "site A: num_samples 0"),
        ([1, 2], "site A: the reply is not a model update"),
    ],
)
def test_a_malformed_reply_is_refused_naming_the_site(reply, message):
    check_reply(
        "site A", {"state": {"w": torch.zeros(2)}, "num_samples": 3}, {"w": torch.zeros(2)}
    )  # a good one passes
    with pytest.raises(SiteError, match=message):
        check_reply("site A", reply, {"w": torch.zeros(2)})


# --- the first half of the matrix on one real federation ------------------------------------------
@pytest.fixture(scope="module")
def federated(tmp_path_factory):
    yield from federated_runs(tmp_path_factory.mktemp("matrix"), FIRST_HALF)


@pytest.mark.slow
@pytest.mark.federation
@pytest.mark.parametrize("name", FIRST_HALF)
def test_every_method_on_a_real_federation_equals_the_engine_byte_for_byte(federated, name):
    assert_equals_the_engine(federated, name, MATRIX[name][0])


def test_a_state_travels_as_one_array_within_two_percent_of_its_bytes():
    """A state is one byte Array plus a compressed index: a 118-tensor UNet's reply costs < 2 % over
    its tensor bytes as Flower sends it (one Array per tensor cost 22 %); a corrupt one is refused."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedmedbench.models import build_model

    state = {
        k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
        for k, v in build_model({"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2})
        .state_dict()
        .items()
    }
    records = pack({"state": state, "num_samples": 8}, loss=0.5)
    raw = sum(v.numel() * v.element_size() for v in state.values())
    sent = sum(len(obj.deflate()) for obj in get_all_nested_objects(records).values())
    assert len(state) == 118 and list(records["a:state"]) == ["bytes"] and raw < sent < 1.02 * raw
    back = unpack(records, "site A")["state"]
    assert list(back) == list(state) and all(
        torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in state.items()
    )
    records["a:state"]["bytes"] = flwr.app.Array(records["a:state"]["bytes"].numpy()[:-4].copy())
    with pytest.raises(SiteError, match="site A: the state's bytes end before tensor"):
        unpack(records, "site A")


def test_nested_models_travel_as_one_array_not_pickled_tensor_by_tensor():
    """Fed-LWR's peers (a dict of states), CFFL's candidates (a list of states), an OrderedDict and a
    bf16 tensor deep in a payload: their tensors ride in one byte Array beside a small skeleton,
    bit for bit (torch.save framed each tensor with ~1 kB: Fed-LWR's queries cost 13 % more than
    their bytes); a skeleton naming a tensor it does not carry is refused naming the site."""
    from collections import OrderedDict

    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedmedbench.models import build_model

    model = build_model({"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2}).state_dict()
    peers = {name: {k: v + i for k, v in model.items()} for i, name in enumerate("ABC")}
    value = {
        "peers": peers,
        "candidates": [OrderedDict(peers["A"]), peers["B"]],
        "mixed": ("x", torch.randn(3).bfloat16(), 2),
    }
    records = pack(value)
    back = unpack(records, "site B")
    assert (
        type(back["candidates"][0]) is OrderedDict
        and back["mixed"][0] == "x"
        and back["mixed"][2] == 2
        and torch.equal(back["mixed"][1], value["mixed"][1])
    )
    for name in "ABC":
        assert all(
            torch.equal(back["peers"][name][k], v) and back["peers"][name][k].dtype == v.dtype
            for k, v in peers[name].items()
        )
    raw = 5 * sum(v.numel() * v.element_size() for v in model.values()) + 6
    sent = sum(len(obj.deflate()) for obj in get_all_nested_objects(records).values())
    assert raw < sent < 1.05 * raw
    records["b"]["mixed"] = pack({"m": ("__fedmedbench_tensor__", 99)})["b"]["m"]
    with pytest.raises(SiteError, match="site B: a payload names tensor 99"):
        unpack(records, "site B")
