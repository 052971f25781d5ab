"""How long ``check-data`` takes to inspect real folders of images (``inspect_folders``): the timing
that tests/test_check_data.py's real-data tests used to assert (a test asserts no wall-clock time:
it failed on a loaded machine). The images are read for their headers only, the masks in full.

Uses the real samples in ../shared/realdata (``FEDMEDBENCH_SHARED``), laid out as the tests lay
them out: TNBC's 50 PNG tiles as three sites of patients, MoNuSeg's 14 TIFFs with masks drawn from
their XML outlines.

    python benchmarks/bench_check_data.py [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedmedbench.data.folders.inspect import inspect_folders  # noqa: E402
from tests import test_check_data as layouts  # noqa: E402  (the tests' own layouts of the real files)


def monuseg_layout(tmp: Path) -> dict:
    import numpy as np
    from PIL import Image

    from fedmedbench.data.nuclei.raw import xml_to_mask

    monuseg, root = layouts.REALDATA / "monuseg" / "datasets" / "MoNuSegTestData", tmp / "monuseg"
    for k, tiff in enumerate(sorted(monuseg.glob("*.tif"))):
        site = "siteA" if k < 7 else "siteB"
        layouts._link(tiff, root / site / "images" / tiff.name)
        mask, _ = xml_to_mask(tiff.with_suffix(".xml"), (1000, 1000))
        (root / site / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray((mask > 0).astype(np.uint8) * 255).save(root / site / "masks" / f"{tiff.stem}.png")
    return {"root": str(root), "mask_values": {0: 0, 255: 1}, "classes": ["background", "nucleus"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if not layouts.REALDATA.exists():
        raise SystemExit(f"{layouts.REALDATA}: not found (../shared/realdata, or set FEDMEDBENCH_SHARED)")
    with tempfile.TemporaryDirectory(prefix="bench-check-data-") as tmp:
        tmp = Path(tmp)
        cases = {"tnbc (50 PNG tiles)": layouts._tnbc_layout(tmp)[0], "monuseg (14 TIFFs)": monuseg_layout(tmp)}
        for name, options in cases.items():
            seconds = []
            for _ in range(args.reps):
                started = time.perf_counter()
                inspect_folders(options, name.split()[0], size_problem=layouts.UNET)
                seconds.append(time.perf_counter() - started)
            print(
                f"{name}: inspect_folders {min(seconds):.2f} s (best of {args.reps}; all: {', '.join(f'{s:.2f}' for s in seconds)})"
            )


if __name__ == "__main__":
    main()
