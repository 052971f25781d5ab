"""OpenCV's ``cv2.resize(src, (w, h))`` on uint8 arrays (``INTER_LINEAR``), bit for bit, in numpy.

Fed-LWR's ``preproces_rif.py`` resizes its images and its class maps with ``cv2.resize(x, (384, 384),
flag)``, where the third positional argument is ``dst``, not the interpolation: both are resized with the
default ``INTER_LINEAR``. The protocol ``fedlwr_bilinear_masks`` reproduces those calls exactly, without
an OpenCV dependency, by following OpenCV's fixed-point path for 8-bit images (``modules/imgproc/src/
resize.cpp``: ``resize``'s coefficient tables, ``HResizeLinear`` and the ``uchar`` specialisation of
``VResizeLinear``):

* source coordinate of output pixel ``d``: ``f = float32((d + 0.5) * in / out - 0.5)``, ``s = floor(f)``,
  weight ``f - s`` (half-pixel centres, two taps, no antialiasing);
* weights as int16 ``round_half_even(w * 2048)`` (``INTER_RESIZE_COEF_SCALE``);
* columns: a tap left of the first or right of the last column is clamped to it with weight 0
  (``sx < 0`` -> ``sx = 0, fx = 0``; ``sx >= w - 1`` -> ``sx = w - 1, fx = 0``);
* rows: the weights are kept and only the row indices are clamped (``resizeGeneric_Invoker``);
* horizontal pass in int: ``S = a0 * x[s] + a1 * x[s + 1]`` (scale 2048);
* vertical pass: ``((b0 * (S0 >> 4)) >> 16) + ((b1 * (S1 >> 4)) >> 16) + 2) >> 2``.

A downscale by exactly 2 is routed to ``INTER_AREA`` by OpenCV; for that factor the two agree (the mean
of each 2 x 2 block, rounded the same way). Checked equal to ``cv2.resize`` of OpenCV 4.8.1 and 5.0.0 on
the RIF sample masks and images and on random arrays of many shapes; ``tests/test_fundus_official_masks.py``
compares it with an independent transcription of the C++ loops and with ``cv2`` where it is installed.
"""

from __future__ import annotations

import numpy as np

COEF_SCALE = 2048  # INTER_RESIZE_COEF_SCALE = 1 << INTER_RESIZE_COEF_BITS (11)


def _taps(n_in: int, n_out: int, clamp_weights: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Source indices (s, s + 1, clamped) and int16-scaled weights (1 - f, f) along one axis."""
    f = ((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5).astype(np.float32)
    s = np.floor(f).astype(np.int64)
    f = (f - s.astype(np.float32)).astype(np.float32)
    if clamp_weights:  # columns: OpenCV moves an outside tap onto the edge pixel with weight 0
        outside = (s < 0) | (s >= n_in - 1)
        s = np.clip(s, 0, n_in - 1)
        f[outside] = 0
    # np.rint rounds half to even, as cvRound / saturate_cast<short>(float) do
    w1 = np.rint(f * np.float32(COEF_SCALE)).astype(np.int64)
    w0 = np.rint((np.float32(1) - f) * np.float32(COEF_SCALE)).astype(np.int64)
    return np.clip(s, 0, n_in - 1), np.clip(s + 1, 0, n_in - 1), w0, w1


def resize_linear_u8(array: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(array, (width, height))`` for a uint8 H x W or H x W x C array."""
    a = np.asarray(array)
    if a.dtype != np.uint8:
        raise TypeError(f"resize_linear_u8 takes uint8 arrays (OpenCV's fixed-point path), got {a.dtype}")
    h, w = a.shape[:2]
    if (h, w) == (height, width):
        return a.copy()
    a = a.astype(np.int64)
    channels = (None,) * (a.ndim - 2)
    y0, y1, b0, b1 = _taps(h, height, clamp_weights=False)
    x0, x1, a0, a1 = _taps(w, width, clamp_weights=True)
    rows = a[:, x0] * a0[(None, slice(None), *channels)] + a[:, x1] * a1[(None, slice(None), *channels)]
    b0, b1 = b0[(slice(None), None, *channels)], b1[(slice(None), None, *channels)]
    out = (((b0 * (rows[y0] >> 4)) >> 16) + ((b1 * (rows[y1] >> 4)) >> 16) + 2) >> 2
    return out.astype(np.uint8)
