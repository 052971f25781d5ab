"""A ``labels.csv`` may carry the user's own columns (age, body site, ...): they are ignored, as
docs/data.md says where it describes labels.csv; a column spelt like ``group`` in any case is
refused as a typo, since ignoring it would let a patient's images into two splits without a word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedmedbench.data.folders import FoldersDataError, preprocess
from fedmedbench.data.store import open_client

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "data.md"


def test_the_guide_says_where_labels_csv_is_described_that_other_columns_are_ignored_and_a_group_typo_refused():
    layout = GUIDE.read_text().split("### Layout", 1)[1].split("###", 1)[0]
    text = " ".join(layout.split())
    assert "Other columns (your metadata: age, body site, ...) are allowed and ignored" in text
    assert "one spelt like `group` (`Group`, `grup`) is refused as a typo" in text


def _data(root: Path, extra: dict[str, list[str]]) -> dict:
    (root / "s").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for k in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / "s" / f"{k}.png")
    table = pd.DataFrame({"site": "s", "image": [f"s/{k}.png" for k in range(6)], "label": ["a", "b"] * 3, **extra})
    table.to_csv(root / "labels.csv", index=False)
    return {"root": str(root), "kind": "classification", "classes": ["a", "b"]}


def test_metadata_columns_are_ignored(tmp_path):
    options = _data(
        tmp_path / "data",
        {"age": [str(30 + k) for k in range(6)], "localization": ["back"] * 6, "patient": [f"P{k}" for k in range(6)]},
    )
    assert preprocess({}, tmp_path / "store", options=options, log=lambda line: None) == {"s": 6}
    meta = open_client(tmp_path / "store", "s").meta
    assert list(meta["group"]) == [f"s/s/{k}.png" for k in range(6)]  # each image its own group: no column used
    assert list(meta["label"]) == ["a", "b"] * 3 and "age" not in meta.columns


@pytest.mark.parametrize("column", ["Group", "grup", "GROUP", "Groups"])
def test_a_column_spelt_like_group_is_refused_in_any_case(tmp_path, column):
    options = _data(tmp_path / "data", {column: ["L1", "L1", "L2", "L2", "L3", "L3"]})
    with pytest.raises(FoldersDataError) as err:
        preprocess({}, tmp_path / "store", options=options, log=lambda line: None)
    assert str(err.value) == (
        f"{tmp_path / 'data' / 'labels.csv'}: unknown column {column!r} (did you mean 'group'?); "
        "expected site, image, label and optionally group"
    )
    assert not (tmp_path / "store").exists()
