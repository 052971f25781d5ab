"""Every seeded split of every family keeps a group (case, patient, lesion, slide, image) in one split.

Each family's synthetic twin goes through its real parser and its split, as in the pipeline."""

import pytest

from fedmedbench.data import is_archive, load_family
from fedmedbench.data.archive import safe_extract
from fedmedbench.data.store import read_split_csv

CASES = [
    # family, protocol, seeded permutation, synthetic options, image size
    ("prostate", "harmofl", "seeded", {"cases_per_site": 4, "depth": 8, "size": 24}, 24),
    ("prostate", "fedlwr", "seeded", {"cases_per_site": 4, "depth": 8, "size": 24}, 24),
    (
        "camelyon17",
        "harmofl",
        "slide",
        {"patches_per_center": 30, "patch_size": 16},
        16,
    ),  # default = HarmoFL's patch-level split
    ("nuclei", "harmofl", "default", {"images_per_site": 6, "image_size": 48}, 32),
    ("skin", "prrfl", "seeded", {}, 16),
    ("fundus", "fedlwr", "seeded", {"train_per_domain": 6, "test_per_domain": 2, "size": 24}, 16),
]


@pytest.mark.parametrize(
    ("family", "protocol", "permutation", "options", "size"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
def test_seeded_split_keeps_every_group_in_one_split(tmp_path, family, protocol, permutation, options, size):
    module = load_family(family)
    module.write_synthetic(tmp_path / "raw", seed=0, **options)
    raw = {}
    for spec in module.DOWNLOADS:
        path = tmp_path / "raw" / spec.filename
        raw[spec.filename] = (
            safe_extract(path, tmp_path / "extracted" / spec.filename) if is_archive(spec.filename) else path
        )
    module.preprocess(raw, tmp_path / "store", protocol, expect_real_counts=False, size=size, log=lambda *a: None)
    module.split(tmp_path / "store", tmp_path / "split.csv", protocol, permutation=permutation, seed=0)
    split = read_split_csv(tmp_path / "split.csv")
    splits_per_group = split.groupby(["client", "group"])["split"].nunique()
    assert splits_per_group.max() == 1, splits_per_group[splits_per_group > 1].head().to_dict()
    # and the split is not degenerate: every training client has train, val and test rows
    for client, rows in split.groupby("client"):
        if set(rows.split) != {"test"}:  # a test-only cohort (skin's OOD) is fine
            assert set(rows.split) == {"train", "val", "test"}, client
    # more than one group per client, or the check would be trivially true
    assert split.groupby("client")["group"].nunique().max() > 1
