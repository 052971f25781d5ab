"""The official fundus masks (protocol ``fedlwr_bilinear_masks``) are what Fed-LWR's ``preproces_rif.py`` makes.

Its two mask lines (``prepare_fundus``, IAMJackYan/Fed-LWR @ 09a2afbd, ``preproces_rif.py:85-86``)::

    mask = 2 - np.array(cv2.imread(mask_path, 0) / 127, dtype='uint8')
    mask = cv2.resize(mask, (384, 384), cv2.INTER_NEAREST)   # 3rd positional argument = dst: bilinear

are transcribed here independently of ``fedmedbench.data.fundus.opencv_resize``: OpenCV's C++ loops
(``resize``'s coefficient tables, ``HResizeLinear``, ``VResizeLinear<uchar>``) written out one output
column and one output row at a time. Where ``cv2`` is installed it is the reference as well.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmedbench.data import fundus as F
from fedmedbench.data.images import read_mask
from fedmedbench.data.store import open_client
from tests.conftest import realdata_dir

REAL_ROOT = realdata_dir() / "rif_fundus" / "data" / "Fundus"


def _coefficients(n_in: int, n_out: int, clamp: bool):
    """resize.cpp's loop over dx (clamp=True, ``xofs``/``ialpha``) or dy (clamp=False, ``yofs``/``ibeta``)."""
    ofs, alpha = [], []
    scale = n_in / n_out
    for d in range(n_out):
        f = np.float32((d + 0.5) * scale - 0.5)
        s = int(np.floor(f))
        f = np.float32(f - np.float32(s))
        if clamp and s < 0:
            f, s = np.float32(0), 0
        if clamp and s >= n_in - 1:
            f, s = np.float32(0), n_in - 1
        c0, c1 = np.float32(1) - f, f
        alpha.append((int(np.rint(c0 * np.float32(2048))), int(np.rint(c1 * np.float32(2048)))))
        ofs.append(s)
    return ofs, alpha


def cv2_resize_transcribed(src: np.ndarray, width: int, height: int) -> np.ndarray:
    """``cv2.resize(src, (width, height))`` for a 2-D uint8 array, OpenCV's fixed-point INTER_LINEAR."""
    h, w = src.shape
    if (h, w) == (height, width):
        return src.copy()
    xofs, ialpha = _coefficients(w, width, clamp=True)
    yofs, ibeta = _coefficients(h, height, clamp=False)
    s = src.astype(np.int64)
    # HResizeLinear: every source row to `width` int sums of scale 2048
    hrow = np.empty((h, width), np.int64)
    for dx in range(width):
        sx = xofs[dx]
        a0, a1 = ialpha[dx]
        hrow[:, dx] = s[:, sx] * a0 + s[:, min(sx + 1, w - 1)] * a1
    out = np.empty((height, width), np.uint8)
    for dy in range(height):
        r0, r1 = min(max(yofs[dy], 0), h - 1), min(max(yofs[dy] + 1, 0), h - 1)  # resizeGeneric_Invoker's clip
        b0, b1 = ibeta[dy]
        S0, S1 = hrow[r0], hrow[r1]
        out[dy] = (((b0 * (S0 >> 4)) >> 16) + ((b1 * (S1 >> 4)) >> 16) + 2) >> 2  # VResizeLinear<uchar>
    return out


def official_mask(grey: np.ndarray, size: int = 384) -> np.ndarray:
    """The two lines of ``prepare_fundus``; ``grey`` is ``cv2.imread(mask_path, 0)``."""
    mask = 2 - np.array(grey / 127, dtype="uint8")
    return cv2_resize_transcribed(mask, size, size)


# --- the transcription itself --------------------------------------------------------------------------


def test_the_transcription_follows_opencvs_fixed_point_on_hand_computed_cases():
    # halving 0,0,2,2 -> the mean of each pair: 0 and 2; 0,2 -> 1 (= rim between background and cup)
    assert cv2_resize_transcribed(np.array([[0, 0, 2, 2]] * 2, np.uint8), 2, 1).tolist() == [[0, 2]]
    assert cv2_resize_transcribed(np.array([[0, 2]] * 2, np.uint8), 1, 1).tolist() == [[1]]
    # doubling [0, 100]: weights 0.75/0.25 -> 25 and 75, edges replicated
    assert cv2_resize_transcribed(np.array([[0, 100]] * 2, np.uint8), 4, 2)[0].tolist() == [0, 25, 75, 100]
    # 2 -> 5 columns: f = 0.1, 0.5, 0.9 (weights of 1: 205, 1024, 1843 of 2048) -> 0, 1 (a tie rounds up), 1
    assert cv2_resize_transcribed(np.array([[0, 1]] * 2, np.uint8), 5, 2)[0].tolist() == [0, 0, 1, 1, 1]


def test_the_project_resize_equals_the_transcription_on_random_arrays():
    rng = np.random.default_rng(0)
    for h, w, height, width in [
        (800, 800, 384, 384),
        (37, 53, 64, 48),
        (9, 7, 3, 5),
        (6, 6, 3, 3),
        (1, 5, 4, 4),
        (384, 384, 384, 384),
        (100, 160, 384, 384),
    ]:
        x = rng.integers(0, 256, (h, w)).astype(np.uint8)
        np.testing.assert_array_equal(
            F.opencv_resize.resize_linear_u8(x, width, height), cv2_resize_transcribed(x, width, height)
        )
    rgb = rng.integers(0, 256, (23, 31, 3)).astype(np.uint8)
    got = F.opencv_resize.resize_linear_u8(rgb, 40, 17)
    for c in range(3):
        np.testing.assert_array_equal(got[..., c], cv2_resize_transcribed(rgb[..., c], 40, 17))


def test_opencv_itself_where_it_is_installed():
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(1)
    for h, w, height, width in [(800, 800, 384, 384), (37, 53, 64, 48), (9, 7, 3, 5)]:
        x = rng.integers(0, 256, (h, w)).astype(np.uint8)
        np.testing.assert_array_equal(
            cv2.resize(x, (width, height), cv2.INTER_NEAREST), cv2_resize_transcribed(x, width, height)
        )
        np.testing.assert_array_equal(
            F.opencv_resize.resize_linear_u8(x, width, height), cv2.resize(x, (width, height))
        )


# --- the official variant on a mask: order, interpolation, rounding, dtype ----------------------------


def _ring_mask(n: int = 50) -> np.ndarray:
    y, x = np.mgrid[0:n, 0:n]
    r = np.hypot(y - n / 2, x - n / 2)
    grey = np.full((n, n), 255, np.uint8)
    grey[r < n / 3] = 128
    grey[r < n / 6] = 0
    return grey


def test_the_official_variant_maps_first_and_resizes_the_class_map_bilinearly(tmp_path):
    grey = _ring_mask()
    from PIL import Image

    image = tmp_path / "i.png"
    mask = tmp_path / "m.png"
    Image.fromarray(np.stack([grey] * 3, -1)).save(image)
    Image.fromarray(grey).save(mask)
    _, labels, _ = F.raw.load_pair(image, mask, 24, "bilinear")
    assert labels.dtype == np.uint8 and labels.shape == (24, 24)
    np.testing.assert_array_equal(labels, official_mask(grey, 24))
    # not the order the project used before (resize the grey mask, then map): that one differs here
    grey_first = F.raw.fedlwr_code_mask_to_classes(F.raw.resize_bilinear(grey, 24))
    assert (grey_first != labels).sum() > 0


@pytest.mark.shared
@pytest.mark.skipif(not REAL_ROOT.is_dir(), reason="no real RIF masks (../shared/realdata/rif_fundus)")
def test_the_official_masks_equal_the_transcription_on_real_rif_masks():
    masks = sorted(REAL_ROOT.glob("Domain*/*/ROIs/mask/*.png"))
    assert masks
    for path in masks[:: max(1, len(masks) // 4)][:4]:  # one per domain: ~1 s each in the transcription
        grey = read_mask(path)  # the release's 3-channel masks have equal channels: cv2.imread(p, 0) = that
        expected = official_mask(grey)
        image = path.parent.parent / "image" / path.name
        _, labels, _ = F.raw.load_pair(image, path, 384, "bilinear")
        np.testing.assert_array_equal(labels, expected, err_msg=str(path))
        assert set(np.unique(labels)) == {0, 1, 2}


@pytest.mark.shared
@pytest.mark.skipif(not REAL_ROOT.is_dir(), reason="no real RIF masks (../shared/realdata/rif_fundus)")
def test_the_official_store_holds_those_masks(tmp_path):
    """Through preprocess: a real mask of the store equals the transcription of the official two lines."""
    raw = tmp_path / "raw" / "Fundus"
    for domain in F.sites.DOMAINS:
        for split in F.raw.OFFICIAL_SPLITS:
            for kind in ("image", "mask"):
                src = sorted((REAL_ROOT / domain / split / "ROIs" / kind).glob("*.png"))[:1]
                dst = raw / domain / split / "ROIs" / kind
                dst.mkdir(parents=True)
                for p in src:
                    (dst / p.name).symlink_to(p)
    F.preprocess(
        {F.download.ARCHIVE: tmp_path / "raw"}, tmp_path / "store", "fedlwr_bilinear_masks", log=lambda m: None
    )
    data = open_client(tmp_path / "store", "Domain2")
    name = data.meta["name"].iloc[0]
    grey = read_mask(REAL_ROOT / "Domain2" / "train" / "ROIs" / "mask" / name)
    np.testing.assert_array_equal(data.labels[0], official_mask(grey))
