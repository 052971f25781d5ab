"""PRR-FL's Progressive Fourier Aggregation (ops.fourier.fourier_aggregate) in isolation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedmedbench.ops.fourier import fourier_aggregate, low_frequency_mask, matrix_as_weight, progressive_radius, weight_as_matrix


def clients(shape, count=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(count)]


SHAPES = [(8, 4, 3, 3), (6, 5), (16, 3, 3, 3), (3, 7)]


@pytest.mark.parametrize("mode", ["paper", "official"])
@pytest.mark.parametrize("shape", SHAPES)
def test_radius_zero_leaves_every_client_unchanged(shape, mode):
    ws = clients(shape)
    for w, out in zip(ws, fourier_aggregate(ws, 0.0, mode=mode)):
        assert out.shape == w.shape and out.dtype == w.dtype
        assert torch.allclose(out, w, atol=1e-6)


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
    ws = [matrix_as_weight(torch.fft.ifft2(spectrum.abs() * s * torch.exp(1j * phase)).real.float(), torch.Size(shape)) for s in (0.5, 1.0, 2.5)]
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


def test_paper_box_is_symmetric_about_dc_and_official_half_open():
    # size 8, radius 0.6: b = floor(8 * 0.6 / 2) = 2, centre 4
    assert low_frequency_mask(8, 0.6, "official").nonzero().flatten().tolist() == [2, 3, 4, 5]
    assert low_frequency_mask(8, 0.6, "paper").nonzero().flatten().tolist() == [3, 4, 5]
    assert not low_frequency_mask(8, 0.1, "paper").any() and not low_frequency_mask(8, 0.1, "official").any()


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
        a[max(ch - bh, 0) : ch + bh, max(cw - bw, 0) : cw + bw] = mean[max(ch - bh, 0) : ch + bh, max(cw - bw, 0) : cw + bw]
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
