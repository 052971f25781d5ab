"""PRR-FL's Progressive Fourier Aggregation (ops.fourier.fourier_aggregate) in isolation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmedbench.ops.fourier import (
    fourier_aggregate,
    low_frequency_mask,
    matrix_as_weight,
    progressive_radius,
    weight_as_matrix,
)


def clients(shape, count=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(count)]


SHAPES = [(8, 4, 3, 3), (6, 5), (16, 3, 3, 3), (3, 7)]


@pytest.mark.parametrize("shape", SHAPES)
def test_radius_zero_leaves_every_client_unchanged_in_official_mode(shape):
    ws = clients(shape)
    for w, out in zip(ws, fourier_aggregate(ws, 0.0, mode="official")):
        assert out.shape == w.shape and out.dtype == w.dtype
        assert torch.allclose(out, w, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_radius_zero_in_paper_mode_shares_only_the_dc_amplitude(shape):
    # Eq. 2's closed box |f| <= 0 still holds f = 0: each client's |DC| becomes the mean |DC|.
    ws = clients(shape)
    mean_dc = sum(weight_as_matrix(w).double().sum().abs() for w in ws) / len(ws)
    for w, out in zip(ws, fourier_aggregate(ws, 0.0, mode="paper")):
        before, after = torch.fft.fft2(weight_as_matrix(w).double()), torch.fft.fft2(weight_as_matrix(out).double())
        assert after[0, 0].abs() == pytest.approx(float(mean_dc), rel=1e-5)
        assert torch.sign(after[0, 0].real) == torch.sign(before[0, 0].real)
        assert torch.allclose(after.flatten()[1:], before.flatten()[1:], atol=1e-5)


@pytest.mark.parametrize("mode", ["paper", "official"])
@pytest.mark.parametrize("shape", SHAPES)
def test_identical_clients_are_unchanged(shape, mode):
    w = clients(shape, 1)[0]
    for out in fourier_aggregate([w.clone() for _ in range(3)], 0.9, mode=mode):
        assert torch.allclose(out, w, atol=1e-6)


@pytest.mark.parametrize("mode", ["paper", "official"])
def test_one_client_is_the_identity(mode):
    w = clients((8, 4, 3, 3), 1)[0]
    assert torch.equal(fourier_aggregate([w], 0.9, mode=mode)[0], w)


@pytest.mark.parametrize("shape", SHAPES)
def test_full_box_with_identical_phases_gives_every_client_the_same_amplitude(shape):
    base = weight_as_matrix(clients(shape, 1)[0])
    spectrum = torch.fft.fft2(base.double())
    phase = torch.angle(spectrum)
    # Same phase, different amplitudes (scaled per client): the results must all be the mean.
    ws = [
        matrix_as_weight(torch.fft.ifft2(spectrum.abs() * s * torch.exp(1j * phase)).real.float(), torch.Size(shape))
        for s in (0.5, 1.0, 2.5)
    ]
    outs = fourier_aggregate(ws, 4.0)  # a box wider than every axis
    for out in outs:
        assert torch.allclose(out, outs[0], atol=1e-5)
        amp = torch.fft.fft2(weight_as_matrix(out).double()).abs()
        assert torch.allclose(amp, spectrum.abs() * (0.5 + 1.0 + 2.5) / 3, atol=1e-4)


def test_weights_move_the_mean_amplitude():
    base = weight_as_matrix(clients((6, 5), 1)[0])
    ws = [base * 1.0, base * 3.0]
    out = fourier_aggregate(ws, 4.0, weights=[3.0, 1.0])  # normalised to 0.75 / 0.25
    assert torch.allclose(out[0], base * 1.5, atol=1e-5) and torch.allclose(out[1], base * 1.5, atol=1e-5)


@pytest.mark.parametrize("shape", [(8, 4, 3, 3), (6, 5), (5, 2, 3, 3), (7, 9)])
def test_shapes_round_trip(shape):
    w = clients(shape, 1)[0]
    assert torch.equal(matrix_as_weight(weight_as_matrix(w), w.shape), w)
    if len(shape) == 4:
        n, c, k1, k2 = shape
        assert weight_as_matrix(w).shape == (c * k1, k2 * n)
        assert torch.equal(weight_as_matrix(w), w.permute(1, 2, 3, 0).reshape(c * k1, k2 * n))
    else:
        assert torch.equal(weight_as_matrix(w), w)


def bins(size, radius, mode):
    return low_frequency_mask(size, radius, mode).nonzero().flatten().tolist()


def test_box_masks_by_hand():
    # paper: |index - size//2| <= size * radius / 2 (Eq. 2, r = radius / 2, closed);
    # official: [c - b, c + b) with c = size // 2, b = floor(size * radius / 2).
    # size 8, radius 0.6: bound 2.4, c = 4, b = 2
    assert bins(8, 0.6, "paper") == [2, 3, 4, 5, 6]
    assert bins(8, 0.6, "official") == [2, 3, 4, 5]
    # size 8, radius 0.1: bound 0.4, b = 0 -> the paper box is the DC bin, the official one empty
    assert bins(8, 0.1, "paper") == [4] and bins(8, 0.1, "official") == []
    # the 3 rows of a 3-class classifier at radius 0.7: bound 1.05, c = 1, b = 1
    assert bins(3, 0.7, "paper") == [0, 1, 2]
    assert bins(3, 0.7, "official") == [0, 1]
    # its 64 columns: bound 22.4, c = 32, b = 22
    assert bins(64, 0.7, "paper") == list(range(10, 55))  # 45 bins
    assert bins(64, 0.7, "official") == list(range(10, 54))  # 44 bins
    # odd axis, 9 = 3 x 3 (a conv's C_in * k with C_in = 3), radius 0.7: bound 3.15, c = 4, b = 3
    assert bins(9, 0.7, "paper") == [1, 2, 3, 4, 5, 6, 7]
    assert bins(9, 0.7, "official") == [1, 2, 3, 4, 5, 6]
    # a bound that is an integer on paper but not in floating point (100 * 0.58 = 57.99999999999999)
    assert bins(100, 0.58, "paper") == list(range(21, 80))  # |f| <= 29
    assert bins(100, 0.58, "official") == list(range(22, 78))  # b = floor(28.999999999999996) = 28


def test_paper_mode_shares_the_mean_amplitude_exactly_in_the_hand_box():
    """A (3, 8) linear weight at radius 0.7: rows |f| <= 1.05 -> all 3, columns |f| <= 2.8 -> 2..6
    (after fftshift, centre (1, 4)); 15 of 24 bins take the mean amplitude, the rest stay the client's."""
    ws = clients((3, 8), count=3, seed=5)
    box = torch.zeros(3, 8, dtype=torch.bool)
    box[:, 2:7] = True
    amps = [torch.fft.fftshift(torch.fft.fft2(w.double()).abs()) for w in ws]
    mean = sum(amps) / 3
    for a, out in zip(amps, fourier_aggregate(ws, 0.7, mode="paper")):
        got = torch.fft.fftshift(torch.fft.fft2(out.double()).abs())
        assert torch.allclose(got[box], mean[box], atol=1e-5)
        assert torch.allclose(got[~box], a[~box], atol=1e-5)
        assert not torch.allclose(got[box], a[box], atol=1e-3)


@pytest.mark.parametrize("shape", SHAPES)
def test_paper_mode_result_is_real_up_to_rounding(shape):
    ws = clients(shape)
    mats = [weight_as_matrix(w).double() for w in ws]
    amp = [torch.fft.fftshift(torch.fft.fft2(m).abs()) for m in mats]
    mean = sum(amp) / len(amp)
    h, w = mats[0].shape
    box = low_frequency_mask(h, 0.8, "paper")[:, None] & low_frequency_mask(w, 0.8, "paper")[None, :]
    for m, a in zip(mats, amp):
        mixed = torch.where(box, mean, a)
        complex_out = torch.fft.ifft2(torch.fft.ifftshift(mixed) * torch.exp(1j * torch.angle(torch.fft.fft2(m))))
        assert complex_out.imag.abs().max() < 1e-10


def official_numpy(weights, radius, is_conv):
    """The official server.py avg_freq, written out with numpy (uniform /K, half-open box, real part)."""
    mats = []
    for w in weights:
        w = w.numpy().astype(np.float64)
        if is_conv:
            n, c, k1, k2 = w.shape
            w = np.transpose(w, (1, 2, 3, 0)).reshape(c * k1, k2 * n)
        mats.append(w)
    ffts = [np.fft.fft2(m, axes=(-2, -1)) for m in mats]
    amps = [np.fft.fftshift(np.abs(f), axes=(-2, -1)) for f in ffts]
    phases = [np.angle(f) for f in ffts]
    mean = sum(amps) / len(amps)
    h, w = mats[0].shape
    bh, bw = int(np.floor(h * radius / 2)), int(np.floor(w * radius / 2))
    ch, cw = int(np.floor(h / 2)), int(np.floor(w / 2))
    outs = []
    for a, p, orig in zip(amps, phases, weights):
        a = a.copy()
        a[max(ch - bh, 0) : ch + bh, max(cw - bw, 0) : cw + bw] = mean[
            max(ch - bh, 0) : ch + bh, max(cw - bw, 0) : cw + bw
        ]
        rec = np.real(np.fft.ifft2(np.fft.ifftshift(a, axes=(-2, -1)) * np.exp(1j * p), axes=(-2, -1)))
        if is_conv:
            n, c, k1, k2 = orig.shape
            rec = np.transpose(rec.reshape(c, k1, k2, n), (3, 0, 1, 2))
        outs.append(rec)
    return outs


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("radius", [0.7, 0.83, 0.945])
def test_official_mode_equals_a_numpy_transcription(shape, radius):
    ws = clients(shape, seed=3)
    ours = fourier_aggregate(ws, radius, weights=[0.1, 0.2, 0.3, 0.4], mode="official")  # weights ignored
    for out, ref in zip(ours, official_numpy(ws, radius, len(shape) == 4)):
        assert np.allclose(out.numpy(), ref, atol=1e-6)


def test_progressive_radius_goes_linearly_from_start_towards_end():
    radii = [progressive_radius(r, 50, 0.7, 0.95) for r in range(1, 51)]
    assert radii[0] == pytest.approx(0.7) and radii[-1] == pytest.approx(0.7 + 49 / 50 * 0.25)
    assert np.allclose(np.diff(radii), 0.25 / 50)
