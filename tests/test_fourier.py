"""Amplitude normalization (HarmoFL Eqs. 2-4) against per-image numpy references, with numbers."""

import numpy as np
import pytest
import torch

from fedmedbench.ops.fourier import (
    amplitude_normalize,
    amplitude_spectrum,
    batch_mean_amplitude,
    update_running_amplitude,
)


def numpy_normalize(images, target):
    """The definition, image by image: Re ifft2(target * exp(j * angle(fft2(x))))."""
    return np.stack([np.real(np.fft.ifft2(target * np.exp(1j * np.angle(np.fft.fft2(x))))) for x in images])


def numpy_dc_swap(images, target):
    """The official code's normalize(..., L=0): only the (fftshift-centre =) DC amplitude is replaced."""
    out = []
    for x in images:
        spectrum = np.fft.fft2(x)
        amplitude, phase = np.abs(spectrum), np.angle(spectrum)
        amplitude[:, 0, 0] = target[:, 0, 0]
        out.append(np.real(np.fft.ifft2(amplitude * np.exp(1j * phase))))
    return np.stack(out)


@pytest.mark.parametrize("size", [(8, 10), (9, 7)])
def test_full_mode_keeps_each_phase_and_gives_the_target_amplitude(size):
    rng = np.random.default_rng(0)
    images = rng.random((3, 2, *size))
    target = np.abs(np.fft.fft2(rng.random((5, 2, *size)) * 4.0)).mean(axis=0)  # another site's mean amplitude
    out = amplitude_normalize(torch.from_numpy(images), torch.from_numpy(target)).numpy()
    assert out.shape == images.shape and out.dtype == np.float64

    spectrum_out, spectrum_in = np.fft.fft2(out), np.fft.fft2(images)
    np.testing.assert_allclose(np.abs(spectrum_out), np.broadcast_to(target, out.shape), rtol=0, atol=1e-10)
    unit_out, unit_in = spectrum_out / np.abs(spectrum_out), spectrum_in / np.abs(spectrum_in)
    np.testing.assert_allclose(unit_out, unit_in, rtol=0, atol=1e-10)  # every image keeps its own phase
    np.testing.assert_allclose(out, numpy_normalize(images, target), rtol=0, atol=1e-12)
    # The images now differ from the inputs but not from each other's amplitude.
    assert np.abs(out - images).max() > 0.1


def test_full_mode_is_the_real_part_for_any_target_and_zero_coefficients():
    rng = np.random.default_rng(1)
    images = rng.random((2, 3, 6, 8))
    images[1] = 0.5  # constant image: every non-DC coefficient is 0 (phase taken as 0, like numpy)
    target = rng.random((3, 6, 8)) * 10  # not Hermitian-symmetric
    out = amplitude_normalize(torch.from_numpy(images), torch.from_numpy(target)).numpy()
    np.testing.assert_allclose(out, numpy_normalize(images, target), rtol=0, atol=1e-12)


def test_own_amplitude_gives_back_the_image_and_float32_stays_float32():
    x = torch.rand(1, 3, 12, 12, generator=torch.Generator().manual_seed(0))
    out = amplitude_normalize(x, amplitude_spectrum(x)[0])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x, rtol=0, atol=1e-5)
    half = amplitude_normalize(x.half(), amplitude_spectrum(x)[0])
    assert half.dtype == torch.float16


def test_dc_mode_is_a_per_channel_mean_shift():
    rng = np.random.default_rng(2)
    images = rng.random((4, 3, 7, 6)) - 0.2
    images[3, 1] -= 1.0  # a channel with a negative sum: its DC phase is pi
    target = np.abs(np.fft.fft2(rng.random((3, 3, 7, 6)))).mean(axis=0)
    out = amplitude_normalize(torch.from_numpy(images), torch.from_numpy(target), mode="dc").numpy()
    np.testing.assert_allclose(out, numpy_dc_swap(images, target), rtol=0, atol=1e-12)

    shift = out - images  # constant over H, W for every image and channel
    np.testing.assert_allclose(shift, np.broadcast_to(shift[..., :1, :1], shift.shape), rtol=0, atol=1e-12)
    sums = images.sum(axis=(-2, -1))
    expected = (np.where(sums < 0, -1, 1) * target[:, 0, 0] - sums) / (7 * 6)
    np.testing.assert_allclose(shift[..., 0, 0], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(
        out[:3].mean(axis=(-2, -1)), np.broadcast_to(target[:, 0, 0] / 42, (3, 3)), rtol=0, atol=1e-12
    )

    # Only the DC amplitude is read: a (C, 1, 1) target gives the same result.
    dc_only = amplitude_normalize(
        torch.from_numpy(images), torch.from_numpy(target[:, :1, :1].copy()), mode="dc"
    ).numpy()
    np.testing.assert_array_equal(dc_only, out)


def test_spectrum_and_batch_mean_amplitude_match_numpy():
    rng = np.random.default_rng(3)
    for shape in [(3, 2, 8, 8), (2, 3, 7, 9)]:
        images = rng.random(shape)
        reference = np.abs(np.fft.fft2(images))
        np.testing.assert_allclose(amplitude_spectrum(torch.from_numpy(images)).numpy(), reference, rtol=0, atol=1e-12)
        np.testing.assert_allclose(
            batch_mean_amplitude(torch.from_numpy(images)).numpy(), reference.mean(axis=0), rtol=0, atol=1e-12
        )
        dc = batch_mean_amplitude(torch.from_numpy(images), mode="dc").numpy()
        assert dc.shape == (shape[1], 1, 1)
        np.testing.assert_allclose(dc[:, 0, 0], reference[:, :, 0, 0].mean(axis=0), rtol=0, atol=1e-12)


def test_running_amplitude_by_hand():
    a1, a2, a3 = (torch.tensor(v, dtype=torch.float64) for v in ([10.0, 20.0], [30.0, 0.0], [0.0, 50.0]))
    # Paper, literally (A_0 = 0): A_1 = 0.1 a1 = (1, 2); A_2 = 0.9 A_1 + 0.1 a2 = (3.9, 1.8); A_3 = (3.51, 6.62).
    running = None
    for batch, expected in [(a1, [1.0, 2.0]), (a2, [3.9, 1.8]), (a3, [3.51, 6.62])]:
        running = update_running_amplitude(running, batch, decay=0.1, init="zero")
        torch.testing.assert_close(running, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    # Official code: the first batch initialises it (10, 20); then (12, 18); then (10.8, 21.2).
    running = None
    for batch, expected in [(a1, [10.0, 20.0]), (a2, [12.0, 18.0]), (a3, [10.8, 21.2])]:
        running = update_running_amplitude(running, batch, decay=0.1, init="first_batch")
        torch.testing.assert_close(running, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    # Official code as it runs (momentum truncated to 0): frozen at the first batch, bit for bit.
    running = update_running_amplitude(None, a1, decay=0.0, init="first_batch")
    for batch in (a2, a3):
        running = update_running_amplitude(running, batch, decay=0.0, init="first_batch")
    assert torch.equal(running, a1)
    with pytest.raises(ValueError):
        update_running_amplitude(None, a1, init="ones")


def test_rejects_bad_mode_and_shape():
    x = torch.rand(2, 3, 8, 8)
    with pytest.raises(ValueError):
        amplitude_normalize(x, torch.ones(3, 8, 8), mode="low")
    with pytest.raises(ValueError):
        amplitude_normalize(x, torch.ones(3, 4, 4))
