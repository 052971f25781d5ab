"""Amplitude normalization in the Fourier domain (HarmoFL, Jiang et al. AAAI 2022, Eqs. 2-4).

Every function works on a whole batch ``(B, C, H, W)`` on the batch's own device with ``torch.fft``:
no per-image loop and no round trip through numpy.

- ``amplitude_spectrum(images)``: per image and channel ``|FFT2(x)|`` over (H, W), no fftshift
  (the DC bin is ``[..., 0, 0]``), shape ``(B, C, H, W)``.
- ``batch_mean_amplitude(images, mode)``: the in-batch average amplitude ``1/M sum_m A_{x_m}`` of Eq. 3,
  ``(C, H, W)``; with ``mode="dc"`` only the zero-frequency bin, ``(C, 1, 1)``.
- ``update_running_amplitude(running, batch_amplitude, decay, init)``: Eq. 3,
  ``A_k = (1 - v) A_{k-1} + v * batch_amplitude``, ``A_0 = 0`` (``running=None``: no batch seen yet).
- ``amplitude_normalize(images, target_amplitude, mode)``: Eq. 4, ``Re F^-1(target * exp(j * phase(x)))``.

PRR-FL's Progressive Fourier Aggregation of one weight tensor across clients is
``fourier_aggregate`` (bottom of this file).

``mode="full"`` is the paper (the whole amplitude spectrum is replaced). ``mode="dc"`` is the official
code (``normalize(..., L=0)`` swaps only the centre bin of the fftshifted spectrum, i.e. the DC
amplitude), which for every image and channel is the mean shift
``y = x - mean_HW(x) + sign(sum_HW x) * A_dc / (H W)``; it is computed in that closed form, without an FFT.
"""

from __future__ import annotations

import torch

MODES = ("full", "dc")
INITS = ("zero", "first_batch")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown amplitude mode {mode!r}; expected one of {MODES}")


def _work_dtype(images: torch.Tensor) -> torch.dtype:
    # torch.fft has no half/bfloat16 kernels for arbitrary sizes: compute those in float32.
    return images.dtype if images.dtype in (torch.float32, torch.float64) else torch.float32


def _full_from_half(half: torch.Tensor, width: int) -> torch.Tensor:
    """Complete an ``rfft2``-layout amplitude ``(..., H, W//2+1)`` to ``(..., H, W)`` with
    ``A(u, v) = A(-u, -v)`` (the amplitude of a real image is Hermitian-symmetric)."""
    kept = width // 2 + 1
    mirrored = torch.roll(torch.flip(half, dims=(-2,)), shifts=1, dims=-2)  # row u -> row -u
    return torch.cat([half, mirrored[..., 1 : width - kept + 1].flip(-1)], dim=-1)


def amplitude_spectrum(images: torch.Tensor) -> torch.Tensor:
    """``|FFT2(x)|`` per image and channel over the last two axes (no fftshift), same shape as ``images``."""
    x = images.to(_work_dtype(images))
    return _full_from_half(torch.fft.rfft2(x).abs(), x.shape[-1])


def batch_mean_amplitude(images: torch.Tensor, mode: str = "full") -> torch.Tensor:
    """The in-batch average amplitude of Eq. 3: mean over the batch of ``|FFT2(x_m)|``.

    ``full``: ``(C, H, W)``. ``dc``: only the zero-frequency bin ``|sum_HW x_m|``, shape ``(C, 1, 1)``
    (all that ``amplitude_normalize(..., mode="dc")`` reads).
    """
    _check_mode(mode)
    x = images.to(_work_dtype(images))
    if mode == "dc":
        return x.sum(dim=(-2, -1), keepdim=True).abs().mean(dim=0)
    return _full_from_half(torch.fft.rfft2(x).abs().mean(dim=0), x.shape[-1])


def update_running_amplitude(
    running: torch.Tensor | None, batch_amplitude: torch.Tensor, decay: float = 0.1, init: str = "zero"
) -> torch.Tensor:
    """Eq. 3: ``A_k = (1 - v) A_{k-1} + v * batch_amplitude`` with decay ``v``; returns a new tensor.

    ``running=None`` means no batch has been seen yet. ``init="zero"`` is the paper's wording
    (``A_0 = 0``, so ``A_1 = v * batch_amplitude``); ``init="first_batch"`` is the official code
    (``if sum(running_amp) == 0: running_amp = amp_avg``, so ``A_1 = batch_amplitude``). With
    ``decay=0`` (the official code's momentum 0.1 truncated to the int 0) the amplitude then stays
    the first batch's forever.
    """
    if init not in INITS:
        raise ValueError(f"unknown running-amplitude init {init!r}; expected one of {INITS}")
    if running is None:
        if init == "first_batch":
            return batch_amplitude.clone()
        running = torch.zeros_like(batch_amplitude)
    return running * (1.0 - decay) + batch_amplitude * decay


def _hermitian_symmetrize(amplitude: torch.Tensor) -> torch.Tensor:
    """``(A(u, v) + A(-u, -v)) / 2``: the part of a target amplitude a real output can carry. The
    average amplitude of real images is already symmetric (up to rounding)."""
    mirrored = torch.roll(torch.flip(amplitude, dims=(-2, -1)), shifts=(1, 1), dims=(-2, -1))
    return 0.5 * (amplitude + mirrored)


def amplitude_normalize(images: torch.Tensor, target_amplitude: torch.Tensor, mode: str = "full") -> torch.Tensor:
    """Replace each image's amplitude spectrum by ``target_amplitude``, keep its phase, return the real part.

    ``images``: ``(B, C, H, W)`` (any leading shape works). ``target_amplitude``: broadcastable to
    ``(C, H, W)`` in the unshifted FFT layout (DC at ``[..., 0, 0]``), e.g. from ``batch_mean_amplitude``.
    Where an image's Fourier coefficient is exactly 0 its phase is taken as 0 (``numpy.angle(0)``).

    ``full``: ``Re F^-1(target * exp(j P_x))``, computed with ``rfft2``/``irfft2`` on the Hermitian-
    symmetric part of the target, which is exactly that real part. ``dc``: only the zero-frequency
    amplitude is replaced, ``y = x - mean_HW(x) + sign(sum_HW x) * target[..., 0, 0] / (H W)``; the
    target may then be ``(C, 1, 1)``.
    The result has the dtype of ``images`` (half precision is computed in float32).
    """
    _check_mode(mode)
    dtype = _work_dtype(images)
    x = images.to(dtype)
    target = target_amplitude.to(device=x.device, dtype=dtype)
    height, width = x.shape[-2:]
    if target.dim() < 2:
        raise ValueError(f"target amplitude needs (..., H, W) axes, got shape {tuple(target_amplitude.shape)}")
    if mode == "dc":
        total = x.sum(dim=(-2, -1), keepdim=True)
        dc = target[..., :1, :1]
        new_dc = torch.where(total < 0, -dc, dc)  # the DC coefficient is real: phase 0 or pi
        out = x - total / (height * width) + new_dc / (height * width)
        return out.to(images.dtype)
    if tuple(target.shape[-2:]) not in ((height, width), (height, 1), (1, width), (1, 1)):
        raise ValueError(f"target amplitude {tuple(target.shape)} does not broadcast to images {tuple(x.shape)}")
    target = _hermitian_symmetrize(target.expand(*target.shape[:-2], height, width))[..., : width // 2 + 1]
    # Y = X * target / |X| on the (re, im) pairs (faster than complex arithmetic); Y = target where X = 0.
    parts = torch.view_as_real(torch.fft.rfft2(x))
    magnitude = torch.hypot(parts[..., 0], parts[..., 1])
    zero = magnitude == 0
    swapped = parts * (target / magnitude.masked_fill_(zero, 1.0)).unsqueeze(-1)
    swapped[..., 0].add_(target * zero)
    return torch.fft.irfft2(torch.view_as_complex(swapped), s=(height, width)).to(images.dtype)


# --- PRR-FL: Progressive Fourier Aggregation (Chen et al., MICCAI 2021, Eqs. 1-3) ---------------------

PFA_MODES = ("paper", "official")


def weight_as_matrix(weight: torch.Tensor) -> torch.Tensor:
    """The 2-D layout PFA transforms: a conv weight ``(N_out, C_in, k1, k2)`` as the official code lays
    it out, ``permute(1, 2, 3, 0) -> (C_in * k1, k2 * N_out)``; a linear weight ``(out, in)`` as is."""
    if weight.dim() == 4:
        n_out, c_in, k1, k2 = weight.shape
        return weight.permute(1, 2, 3, 0).reshape(c_in * k1, k2 * n_out)
    if weight.dim() == 2:
        return weight
    raise ValueError(f"PFA needs a conv (4-D) or linear (2-D) weight, got shape {tuple(weight.shape)}")


def matrix_as_weight(matrix: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of :func:`weight_as_matrix`."""
    if len(shape) == 4:
        n_out, c_in, k1, k2 = shape
        return matrix.reshape(c_in, k1, k2, n_out).permute(3, 0, 1, 2).contiguous()
    return matrix.reshape(shape)


def low_frequency_mask(size: int, radius: float, mode: str, device=None) -> torch.Tensor:
    """Which bins of one fftshifted axis of length ``size`` lie in the averaged box.

    Centre ``c = size // 2`` (the zero frequency after fftshift), frequency ``f = index - c``.
    ``official``: half-width ``b = floor(size * radius / 2)``, the half-open index range ``[c - b, c + b)``
    (2b bins, asymmetric about DC, clipped to the axis; empty at b = 0). ``paper``: Eq. 2's closed
    interval ``|f| <= r * size`` with the paper's ``r = radius / 2`` (symmetric about DC, so the
    aggregate of real weights is real; always holds the DC bin, even at radius 0). E.g. the 3 rows of
    a 3-class classifier at radius 0.7: paper all 3 (|f| <= 1.05), official rows c-1 and c.
    """
    if mode not in PFA_MODES:
        raise ValueError(f"unknown PFA mode {mode!r}; expected one of {PFA_MODES}")
    centre = size // 2
    offset = torch.arange(size, device=device) - centre
    if mode == "official":
        half = int(size * radius // 2)
        return (offset >= -half) & (offset < half)
    # The tolerance keeps a bound that is an integer on paper (e.g. 100 * 0.58 / 2 = 29) from
    # losing its edge bins to floating point (100 * 0.58 = 57.99999999999999).
    return offset.abs() <= size * radius / 2 + 1e-9


def fourier_aggregate(
    tensors: list[torch.Tensor], radius: float, weights: list[float] | None = None, mode: str = "paper"
) -> list[torch.Tensor]:
    """PFA of one weight across clients: one result per client, each of the input's shape and dtype.

    Per client the weight's 2-D layout (:func:`weight_as_matrix`) is transformed with a 2-D FFT into
    amplitude and phase; inside the centred low-frequency box (:func:`low_frequency_mask` on both
    axes) the amplitude is replaced by the clients' mean amplitude; the phase and the amplitude
    outside the box stay the client's own; the inverse FFT's real part goes back to the weight's shape.

    ``paper``: weighted mean amplitude (``weights``, default uniform, normalised to sum 1) over Eq. 2's
    closed box ``|f| <= (radius / 2) * dim``, symmetric about DC, so the imaginary part dropped is
    rounding only. ``official``: the official code's half-open box and unweighted mean (``weights``
    ignored); its imaginary part is not zero.
    ``radius`` is on the official code's scale (the box side is about ``radius`` x the axis length;
    the paper's threshold r is radius / 2). Computed in float64; one client gives its tensor back.
    At radius 0 the official box is empty (the identity); the paper box still shares the DC bin.
    """
    if mode not in PFA_MODES:
        raise ValueError(f"unknown PFA mode {mode!r}; expected one of {PFA_MODES}")
    if not tensors:
        raise ValueError("fourier_aggregate needs at least one tensor")
    shape, dtype = tensors[0].shape, tensors[0].dtype
    if any(t.shape != shape for t in tensors):
        raise ValueError(f"fourier_aggregate: tensors of different shapes {[tuple(t.shape) for t in tensors]}")
    if len(tensors) == 1:
        return [tensors[0].clone()]
    count = len(tensors)
    if mode == "official" or weights is None:
        weights = [1.0 / count] * count
    if len(weights) != count:
        raise ValueError(f"{count} tensors but {len(weights)} weights")
    total = float(sum(weights))
    mats = torch.stack([weight_as_matrix(t.detach()).to(torch.float64) for t in tensors])  # (K, H, W)
    spectrum = torch.fft.fft2(mats)
    amplitude = torch.fft.fftshift(spectrum.abs(), dim=(-2, -1))
    phase = torch.angle(spectrum)
    w = torch.tensor([x / total for x in weights], dtype=torch.float64, device=mats.device).view(-1, 1, 1)
    mean_amplitude = (amplitude * w).sum(dim=0)
    height, width = mats.shape[-2:]
    box = (
        low_frequency_mask(height, radius, mode, mats.device)[:, None]
        & low_frequency_mask(width, radius, mode, mats.device)[None, :]
    )
    mixed = torch.where(box, mean_amplitude, amplitude)
    out = torch.fft.ifft2(torch.fft.ifftshift(mixed, dim=(-2, -1)) * torch.exp(1j * phase)).real
    return [matrix_as_weight(m, shape).to(dtype) for m in out]


def progressive_radius(round_index: int, rounds: int, start: float, end: float) -> float:
    """PFA's schedule after round ``round_index`` (1-based) of ``rounds``: ``start + (t / T) (end - start)``
    with ``t = round_index - 1`` (the official code's 0-based ``a_iter``): from ``start`` to just below ``end``."""
    return start + (round_index - 1) / rounds * (end - start)


__all__ = [
    "MODES", "INITS", "amplitude_spectrum", "batch_mean_amplitude", "update_running_amplitude", "amplitude_normalize",
    "PFA_MODES", "weight_as_matrix", "matrix_as_weight", "low_frequency_mask", "fourier_aggregate", "progressive_radius",
]  # fmt: skip
