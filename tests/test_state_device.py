"""fl/state_device.py: which device storages hold equal bytes, decided in bulk. Run here on CPU
tensors treated as device memory (the code is the same on a GPU, where each bulk step is one wait)."""

from __future__ import annotations

import torch

from fedmedbench.fl import state_device as sd

ALL = lambda storage: True  # noqa: E731 - every storage counts as device memory here
SAMPLE = 64


def key(t: torch.Tensor):
    return sd.storage_key(t.untyped_storage())


def fedavg_like():
    g = torch.Generator().manual_seed(0)
    glob = {"w": torch.randn(1000, generator=g), "b": torch.randn(8, generator=g), "n": torch.tensor(5)}
    clients = [{k: v.clone() for k, v in glob.items()} for _ in range(3)]
    return glob, clients


def test_copies_join_the_first_storage_with_their_bytes_and_a_one_byte_difference_stays_apart():
    glob, clients = fedavg_like()
    middle = clients[1]["w"].view(torch.uint8)
    middle[2000] ^= 1  # the middle of 4,000 bytes: same size and same first/last 64 bytes as the others
    obj = {"global": glob, "clients": clients}
    storages = sd.device_storages(obj, ALL)
    classes, views = sd.equal_classes(storages, SAMPLE)
    assert [v.data_ptr() for v in views.values()] == [s.data_ptr() for s in storages] and views[key(glob["w"])].dtype == torch.uint8 and len(views[key(glob["w"])]) == 4000
    assert classes[key(clients[0]["w"])] == key(glob["w"]) and classes[key(clients[2]["w"])] == key(glob["w"])
    assert classes[key(clients[1]["w"])] == key(clients[1]["w"])  # its own class: never merged
    assert all(classes[key(c["b"])] == key(glob["b"]) for c in clients)  # small: the content is the key
    assert all(classes[key(c["n"])] == key(glob["n"]) for c in clients)
    assert len(set(classes.values())) == 4


def test_members_that_differ_from_the_first_are_compared_again_among_themselves(monkeypatch):
    base = torch.zeros(4096, dtype=torch.uint8)
    a, b, c, d = base.clone(), base.clone(), base.clone(), base.clone()
    b[100] = c[100] = 1  # b == c, both differ from a; d == a. All share size and end samples.
    passes = []
    real = sd._compare
    monkeypatch.setattr(sd, "_compare", lambda pairs: passes.append(len(pairs)) or real(pairs))
    classes, _ = sd.equal_classes(sd.device_storages([a, b, c, d], ALL), SAMPLE)
    assert classes[key(d)] == key(a) and classes[key(c)] == key(b) and classes[key(b)] == key(b)
    assert passes == [3, 1]  # b, c, d against a; then c against b


def test_one_pass_of_compares_for_a_fedavg_state(monkeypatch):
    glob, clients = fedavg_like()
    passes = []
    real = sd._compare
    monkeypatch.setattr(sd, "_compare", lambda pairs: passes.append(len(pairs)) or real(pairs))
    sd.equal_classes(sd.device_storages({"global": glob, "clients": clients}, ALL), SAMPLE)
    assert passes == [3]  # only "w" (4,000 bytes) is compared; "b" and "n" are keyed by content


def test_storages_in_walk_order_each_once_and_only_those_on_the_device():
    t = torch.arange(10.0)
    view = t[2:5]  # shares t's storage
    other = torch.ones(3)
    obj = {"a": [t, view], "b": (other, {"c": t}), "d": {other}}
    storages = sd.device_storages(obj, ALL)
    assert [s.data_ptr() for s in storages] == [t.untyped_storage().data_ptr(), other.untyped_storage().data_ptr()]
    assert sd.device_storages(obj, lambda storage: storage.device.type == "cuda") == []


def test_large_and_stacked_pairs_give_the_same_answers():
    big = torch.zeros(sd.STACK + 8, dtype=torch.uint8)
    big_other = big.clone()
    big_other[-1] = 7
    small = [torch.full((100,), i % 3, dtype=torch.uint8) for i in range(6)]
    s = lambda t: sd.byte_view(t.untyped_storage())  # noqa: E731
    pairs = [(s(big), s(big.clone())), (s(big), s(big_other))] + [(s(small[i]), s(small[j])) for i, j in ((0, 3), (0, 1), (2, 5))]
    assert sd._compare(pairs) == [True, False, True, False, True]


def test_to_host_concatenates_with_offsets():
    views = [torch.arange(3, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8), torch.full((2,), 9, dtype=torch.uint8)]
    host, offsets = sd.to_host(views)
    assert host.tolist() == [0, 1, 2, 9, 9] and offsets == [0, 3, 3]


def test_samples_are_the_whole_small_contents_and_the_two_ends_of_large_ones_in_any_order():
    """Small (at most 2 x sample bytes), empty and large storages interleaved: each sample is the
    content of a small one, and the first and last ``sample`` bytes of a large one (one strided view)."""
    g = torch.Generator().manual_seed(5)
    sizes = [300, 0, 128, 129, 7, 1000, 64]
    tensors = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in sizes]
    samples = sd._samples([sd.byte_view(t.untyped_storage()) for t in tensors], SAMPLE)
    expected = [t.numpy().tobytes() if len(t) <= 2 * SAMPLE else t[:SAMPLE].numpy().tobytes() + t[-SAMPLE:].numpy().tobytes() for t in tensors]
    assert samples == expected and [len(s) for s in samples] == [128, 0, 128, 128, 7, 128, 64]
