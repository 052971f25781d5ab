"""The checkpoint writer's side of fl/state.py: new blobs reach the writer and CRC threads in batches
of about ``CHUNK`` bytes (one ``writev`` each, short writes continued), the file holds exactly the
distinct storages' bytes in order of first appearance, and the walk's fast path for ordinary
tensors still refuses what a checkpoint cannot hold."""

from __future__ import annotations

import ctypes
import json
import os
import zlib

import pytest
import torch

from fedmedbench.fl import state as ckpt_io


def mixed_sizes() -> tuple[list[torch.Tensor], dict]:
    """Nine distinct float32 tensors from 12 bytes to 80 kB, then a copy of each (written once)."""
    torch.manual_seed(0)
    distinct = [torch.randn(n) for n in (3, 100, 300, 700, 1500, 5000, 20000, 256, 9000)]
    obj = {f"a{i}": t for i, t in enumerate(distinct)} | {f"b{i}": t.clone() for i, t in enumerate(distinct)}
    return distinct, obj


def test_blobs_reach_the_writer_in_batches_of_a_chunk_and_land_in_order_of_first_appearance(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt_io, "CHUNK", 4096)
    monkeypatch.setattr(ckpt_io, "SMALL", 1024)  # 12 and 400 bytes staged (copied), the rest views in 4 KiB pieces
    distinct, obj = mixed_sizes()
    batches = []
    real = ckpt_io._write_all
    monkeypatch.setattr(ckpt_io, "_write_all", lambda fd, batch: batches.append([len(b) for b in batch]) or real(fd, batch))
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")

    expected = b"".join(t.numpy().tobytes() for t in distinct)  # 147,436 bytes: the copies add none
    data = (tmp_path / "c.pt").read_bytes()
    assert data[: len(ckpt_io.MAGIC)] == ckpt_io.MAGIC and data[len(ckpt_io.MAGIC) : len(ckpt_io.MAGIC) + len(expected)] == expected
    totals = [sum(batch) for batch in batches]
    assert sum(totals) == len(expected) == 147_436
    # Every hand-over but the last carries at least a CHUNK (so 147,436 bytes in at most 36, not one
    # per piece: 39 pieces and a staged buffer), and none more than a chunk, a piece and a staged buffer.
    assert all(total >= 4096 for total in totals[:-1]) and all(total < 2 * 4096 + 1024 for total in totals)
    assert len(batches) <= len(expected) // 4096 + 1 and sum(len(batch) for batch in batches) > len(batches)
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")  # the CRC of the batches is the CRC of the bytes
    assert all(torch.equal(back[f"a{i}"], t) and torch.equal(back[f"b{i}"], t) for i, t in enumerate(distinct))


def test_short_writes_and_more_buffers_than_one_writev_takes_still_write_every_byte_once(tmp_path, monkeypatch):
    distinct, obj = mixed_sizes()
    ckpt_io.save_checkpoint(obj, tmp_path / "plain.pt")
    monkeypatch.setattr(ckpt_io, "SMALL", 16)  # every tensor but the 12-byte one a buffer of its own
    monkeypatch.setattr(ckpt_io, "_IOV_MAX", 3)
    calls = []

    def short_writev(fd, buffers):  # a writev that stops after 1,000 bytes, mid-buffer
        assert 1 <= len(buffers) <= 3
        calls.append(len(buffers))
        return os.write(fd, b"".join(bytes(b) for b in buffers)[:1000])

    monkeypatch.setattr(ckpt_io, "_writev", short_writev)
    ckpt_io.save_checkpoint(obj, tmp_path / "short.pt")
    assert (tmp_path / "short.pt").read_bytes() == (tmp_path / "plain.pt").read_bytes()
    assert len(calls) >= 147_436 // 1000 and max(calls) == 3  # short writes continued, 3 buffers at most a call


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")  # deprecated in torch; still a dtype a checkpoint must refuse
def test_the_fast_path_still_refuses_what_a_checkpoint_cannot_hold_and_keeps_complex_values(tmp_path):
    z = torch.complex(torch.arange(4.0), -torch.arange(4.0))
    obj = {"z": z, "half": torch.ones(2, dtype=torch.float16), "flag": torch.tensor([True, False])}
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in obj.items())
    for value, what in [
        (z.conj(), r"a Tensor of layout torch\.strided and dtype torch\.complex64"),
        (torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8), r"a Tensor of layout torch\.strided and dtype torch\.qint8"),
        (torch.ones(3).to_sparse(), r"a Tensor of layout torch\.sparse_coo and dtype torch\.float32"),
        (torch.empty(3, device="meta"), r"a tensor on the meta device"),
    ]:
        with pytest.raises(TypeError, match=r"bad\.pt: cannot checkpoint the value at \['w'\]\[1\]: " + what):
            ckpt_io.save_checkpoint({"w": [torch.ones(1), value]}, tmp_path / "bad.pt")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]  # the temporary removed


def trailer(data: bytes) -> tuple[dict, int]:
    """(the index, the blobs' CRC32 the trailer records) of a checkpoint's bytes."""
    _, offset, length, _, data_crc = ckpt_io.TRAILER.unpack(data[-ckpt_io.TRAILER.size :])
    return json.loads(data[offset : offset + length]), data_crc


def test_the_blobs_crc32_is_zlibs_over_the_written_bytes_with_isal_or_without(tmp_path, monkeypatch):
    """The CRC32 is computed on the walk's thread, a batch at a time (ISA-L's where installed):
    the trailer holds zlib.crc32 of exactly the blob bytes in the file, and the file is the same
    byte for byte with zlib's own crc32."""
    monkeypatch.setattr(ckpt_io, "CHUNK", 4096)
    monkeypatch.setattr(ckpt_io, "SMALL", 1024)  # staged buffers and views in several batches
    distinct, obj = mixed_sizes()
    ckpt_io.save_checkpoint(obj, tmp_path / "fast.pt")
    data = (tmp_path / "fast.pt").read_bytes()
    index, data_crc = trailer(data)
    blobs = data[len(ckpt_io.MAGIC) : len(ckpt_io.MAGIC) + sum(index["blobs"])]
    assert len(blobs) == 147_436 and data_crc == zlib.crc32(blobs) == zlib.crc32(b"".join(t.numpy().tobytes() for t in distinct))
    monkeypatch.setattr(ckpt_io, "_CRC32", zlib.crc32)
    ckpt_io.save_checkpoint(obj, tmp_path / "zlib.pt")
    assert (tmp_path / "zlib.pt").read_bytes() == data


def test_the_fast_crc32_continues_zlibs_over_pieces_of_any_size_and_kind():
    """Whichever CRC32 the checkpoint uses (ISA-L's, a pinned dependency, or zlib's), it continues
    zlib's value over pieces of any length, from a numpy slice, a bytearray or a ctypes memoryview."""
    data = torch.randint(0, 256, (300_001,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)).numpy()
    crc, cuts = 0, [0, 1, 7, 4096, 4097, 100_000, 200_000, 300_001]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        piece = [data[a:b], bytearray(data[a:b].tobytes()), memoryview((ctypes.c_char * (b - a)).from_address(data.ctypes.data + a)).cast("B")][i % 3]
        crc = ckpt_io._CRC32(piece, crc)
    assert crc == zlib.crc32(data.tobytes()) and ckpt_io._CRC32(b"", 12345) == 12345


@pytest.mark.parametrize("release, split", [(1 << 20, 1 << 23), (0, 1 << 23), (0, 8192)], ids=["compares-hold-the-gil", "compares-release-the-gil", "compares-split-in-two"])
def test_a_copy_differing_in_one_byte_is_written_and_an_equal_copy_is_not(tmp_path, monkeypatch, release, split):
    """The duplicate compare (libc memcmp, holding the GIL below ``RELEASE`` bytes, releasing it from
    there, in two halves on two threads from ``SPLIT``): a copy of the global weights that differs in
    one bit in the second half, one that differs in the first half (the sampled ends equal), are blobs
    of their own; an equal copy is not; a tensor sharing the global's storage (the same tensor, a
    view) is never compared at all. All three ways write the same file."""
    monkeypatch.setattr(ckpt_io, "RELEASE", release)
    monkeypatch.setattr(ckpt_io, "SPLIT", split)
    torch.manual_seed(0)
    weights = torch.randn(5000)  # 20,000 bytes: halves at 8,192 (a page boundary)
    second, first = weights.clone(), weights.clone()
    second.view(torch.uint8)[10_001] ^= 1  # one bit of one byte, far from either sampled end
    first.view(torch.uint8)[5_000] ^= 128
    obj = {"global": weights, "clients": [weights.clone(), second, first, weights, weights[100:200]]}
    calls = {"held": 0, "released": 0}
    held, released = ckpt_io._MEMCMP_HELD, ckpt_io._MEMCMP
    monkeypatch.setattr(ckpt_io, "_MEMCMP_HELD", lambda a, b, n: calls.__setitem__("held", calls["held"] + 1) or held(a, b, n))
    monkeypatch.setattr(ckpt_io, "_MEMCMP", lambda a, b, n: calls.__setitem__("released", calls["released"] + 1) or released(a, b, n))
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    # Four compares: the equal copy with the global (equal), `second` with it (differs), `first` with
    # both (differs twice); split, each is two memcmps. The global again and its view share its
    # storage and are not compared.
    assert calls == {"held": 4 if release else 0, "released": 0 if release else 4 if split > 20_000 else 8}
    data = (tmp_path / "c.pt").read_bytes()
    index, _ = trailer(data)
    assert index["blobs"] == [20_000] * 3 and index["storages"] == [0, 0, 1, 2]
    blobs = data[len(ckpt_io.MAGIC) : len(ckpt_io.MAGIC) + 60_000]
    assert blobs == weights.numpy().tobytes() + second.numpy().tobytes() + first.numpy().tobytes()
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(back["clients"][1], second) and torch.equal(back["clients"][2], first) and not torch.equal(back["clients"][1], back["global"])
    assert back["clients"][3] is back["global"] and torch.equal(back["clients"][4], weights[100:200]) and torch.equal(back["clients"][0], weights)


def test_each_checkpoint_overwrites_the_one_before_the_previous_and_keeps_path_and_prev_intact(tmp_path):
    """The writer recycles a file instead of creating one: after two checkpoints the one before
    ``.prev`` is kept as the spare, and the next checkpoint is written over it (same inode), cut to
    its own length when it is shorter, grown when longer; ``checkpoint.pt`` and ``.prev`` are
    always whole files of the last two checkpoints, byte for byte what a fresh write gives."""
    path = tmp_path / "checkpoint.pt"
    states = [{"w": torch.full((n,), float(i)), "round": i} for i, n in enumerate((50_000, 40_000, 30_000, 10_000, 60_000))]
    fresh = []
    for i, state in enumerate(states):
        ckpt_io.save_checkpoint(state, tmp_path / f"fresh{i}.pt")
        fresh.append((tmp_path / f"fresh{i}.pt").read_bytes())
    inodes = []
    for i, state in enumerate(states):
        spare_inode = ckpt_io.spare(path).stat().st_ino if ckpt_io.spare(path).exists() else None
        ckpt_io.save_checkpoint(state, path)
        inodes.append(path.stat().st_ino)
        assert path.read_bytes() == fresh[i] and ckpt_io.load_checkpoint(path)["round"] == i
        if i >= 1:
            assert ckpt_io.previous(path).read_bytes() == fresh[i - 1]
        if i >= 2:  # the checkpoint before .prev: kept, not unlinked
            assert ckpt_io.spare(path).read_bytes() == fresh[i - 2]
        if i >= 3:  # written over the spare: its inode, now holding this checkpoint's bytes only
            assert inodes[i] == spare_inode == inodes[i - 3]
    # 10,000 floats over the 40,000-float file: cut; 60,000 over the 30,000-float one: grown.
    assert len(fresh[3]) < len(fresh[1]) and len(fresh[4]) > len(fresh[2])
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("fresh"))
    assert names == [".checkpoint.pt.spare.tmp", "checkpoint.pt", "checkpoint.pt.prev"]


def test_a_failed_write_over_the_spare_leaves_the_last_two_checkpoints_and_no_temporary(tmp_path):
    from fedmedbench.fl import runfolder

    path = tmp_path / "checkpoint.pt"
    for i in range(3):
        ckpt_io.save_checkpoint({"round": i, "w": torch.arange(1000.0) + i}, path)
    last, prev = path.read_bytes(), ckpt_io.previous(path).read_bytes()
    with pytest.raises(TypeError, match=r"checkpoint\.pt: cannot checkpoint the value at \['bad'\]"):
        ckpt_io.save_checkpoint({"w": torch.zeros(3000), "bad": object()}, path)
    assert path.read_bytes() == last and ckpt_io.previous(path).read_bytes() == prev
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.pt.prev"]  # the spare it took is gone
    ckpt_io.save_checkpoint({"round": 3}, path)
    ckpt_io.save_checkpoint({"round": 4}, path)
    assert ckpt_io.spare(path).exists()
    # A run's start and end remove temporaries of atomic writes; the spare is named as one.
    runfolder.remove_stale_files(tmp_path, selection_version=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.pt.prev"]
    assert ckpt_io.load_checkpoint(path) == {"round": 4} and ckpt_io.load_checkpoint(ckpt_io.previous(path)) == {"round": 3}
