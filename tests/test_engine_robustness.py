"""A training job never resumes onto other data, never freezes selection on an undefined score,
leaves no temporaries behind a kill, names the file and round of a failed write, and keeps its
checkpoint when only the checkpoint cadence changes."""

from __future__ import annotations

import errno
import json
import math
import signal

import numpy as np
import pandas as pd
import pytest

from fedmedbench.data.store import write_client, write_split_csv
from fedmedbench.errors import ConfigError, DataError
from fedmedbench.fl import checkpoint, engine
from fedmedbench.fl.selection import Selection
from tests.conftest import interrupt_after_round, tiny_run_config, write_tiny_task
from tests.test_reliability import train_cli


def test_a_resume_onto_a_rebuilt_store_starts_afresh(tmp_path, monkeypatch, caplog):
    """The audit: killed after round 2, the store rebuilt at another image size (same paths); the
    rerun must equal a fresh run on the new data, not continue the old one."""
    store, split = write_tiny_task(tmp_path / "data", size=16)
    cfg = tiny_run_config(store, split, "fedavg", rounds=3)
    interrupt_after_round(cfg, tmp_path / "run", monkeypatch, round_index=2)
    write_tiny_task(tmp_path / "data", size=32)  # rebuilt in place
    with caplog.at_level("WARNING", logger="fedmedbench.engine"):
        engine.run_training(cfg, tmp_path / "run", progress=False)
    assert "the data it was trained on changed since" in caplog.text
    fresh_store, fresh_split = write_tiny_task(tmp_path / "fresh", size=32)
    engine.run_training(
        tiny_run_config(fresh_store, fresh_split, "fedavg", rounds=3), tmp_path / "fresh_run", progress=False
    )
    ours, fresh = (json.loads((tmp_path / d / "final.json").read_text()) for d in ("run", "fresh_run"))
    assert ours["test"] == fresh["test"] and ours["selection"] == fresh["selection"]


def test_a_resume_after_the_split_changed_starts_afresh(tmp_path, monkeypatch, caplog):
    store, split = write_tiny_task(tmp_path / "data")
    cfg = tiny_run_config(store, split, "fedavg", rounds=3)
    interrupt_after_round(cfg, tmp_path / "run", monkeypatch, round_index=2)
    frame = pd.read_csv(split)
    val, test = frame["split"] == "val", frame["split"] == "test"
    frame.loc[val, "split"], frame.loc[test, "split"] = "test", "val"  # as another split seed would
    write_split_csv(frame, split)
    with caplog.at_level("WARNING", logger="fedmedbench.engine"):
        final = engine.run_training(cfg, tmp_path / "run", progress=False)
    assert "the data it was trained on changed since" in caplog.text and "resumed" not in caplog.text
    assert final["selection"]["rounds"] == 3


def test_the_data_digest_sees_content_not_paths(tmp_path):
    from fedmedbench.fl.data import data_digest

    store, split = write_tiny_task(tmp_path / "data", seed=0)
    before = data_digest(store, split, ["A", "B"])
    assert data_digest(store, split, ["A", "B"]) == before
    write_tiny_task(tmp_path / "data", seed=1)  # same sizes, other pixels and labels
    assert data_digest(store, split, ["A", "B"]) != before


def classification_task(root, val_classes=((0, 1), (0, 1)), n_train=9, size=32):
    """Two clients of small images, labels = bright or dark; ``val_classes`` per client's val split."""
    rng = np.random.default_rng(0)
    rows = []
    for name, classes in zip("AB", val_classes):
        labels = np.concatenate([np.arange(n_train) % 2, np.resize(classes, 4), [0, 1]]).astype(np.int64)
        images = (rng.integers(0, 60, (len(labels), size, size, 3)) + 150 * labels[:, None, None, None]).astype(
            np.uint8
        )
        meta = pd.DataFrame(
            {
                "id": [f"{name}/{i}" for i in range(len(labels))],
                "group": [f"{name}/{i}" for i in range(len(labels))],
                "source": "synthetic",
            }
        )
        write_client(root / "store", name, images, labels, meta)
        parts = ["train"] * n_train + ["val"] * 4 + ["test"] * 2
        rows += [
            {"client": name, "split": s, "row": i, "id": f"{name}/{i}", "group": f"{name}/{i}"}
            for i, s in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def classification_config(store, split, **changes):
    cfg = tiny_run_config(
        store, split, "fedavg", clients=("A", "B"), kind="classification", loss="ce", augment="none", rounds=2
    )
    cfg.update(
        model={"name": "vgg_slim", "in_channels": 3, "num_classes": 2, "init_features": 4},
        optimizer={"name": "sgd", "lr": 0.01},
        selection_metric="auc_macro",
    )
    cfg.update(changes)
    return cfg


def test_a_validation_split_that_cannot_define_the_metric_stops_before_training(tmp_path):
    """The audit: client B's validation holds one class, so its AUC is NaN every round and
    selection froze at round 1 with exit 0. Now: one line naming client and metric, nothing trained."""
    store, split = classification_task(tmp_path / "data", val_classes=((0, 1), (1,)), n_train=8)
    with pytest.raises(
        ConfigError,
        match=r"client B: its validation split \(4 samples, classes \[1\]\) cannot define selection_metric 'auc_macro'",
    ):
        engine.run_training(classification_config(store, split), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    final = engine.run_training(
        classification_config(store, split, selection_metric="accuracy"), tmp_path / "ok", progress=False
    )
    assert final["selection"]["metric"] == "accuracy"


def test_an_undefined_score_during_training_is_an_error_never_a_frozen_selection():
    selection = Selection(["A", "B"], "auc_macro", per_client=False)
    assert selection.improved({"A": {"auc_macro": 0.6}, "B": {"auc_macro": 0.9}}, 1) == {"all": ["A", "B"]}
    with pytest.raises(DataError, match=r"round 2: validation auc_macro is undefined \(NaN\) for client\(s\) B"):
        selection.improved({"A": {"auc_macro": 0.7}, "B": {"auc_macro": math.nan}}, 2)


def test_a_last_batch_of_one_under_batchnorm1d_is_named_before_training(tmp_path):
    store, split = classification_task(tmp_path / "data", n_train=9)
    with pytest.raises(
        ConfigError,
        match=r"client A: its train split has 9 samples, so with batch_size 4 the last batch of every epoch holds 1 sample",
    ):
        engine.run_training(
            classification_config(store, split, selection_metric="accuracy"), tmp_path / "run", progress=False
        )


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_kill_during_the_checkpoint_write_leaves_no_temporary_after_the_rerun(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg")
    engine.run_training(cfg, tmp_path / "straight", progress=False)
    out = tmp_path / "killed"
    for moment in ("checkpoint_write:2", "checkpoint_write:4"):  # the selection file, then a checkpoint
        killed = train_cli(cfg, out, kill_at=moment)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert list(out.glob(".*.tmp")), "the kill should have left a temporary"
    assert train_cli(cfg, out).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "final.json",
        "history.csv",
        "model_best.pt",
        "predictions.npz",
        "run_config.json",
    ]
    assert (out / "final.json").read_bytes() == (tmp_path / "straight" / "final.json").read_bytes()


def test_an_orphan_selection_file_of_another_run_is_not_reused(tmp_path, tiny_task):
    """A selection file no checkpoint refers to (a full disk between the two writes, or a run of
    other data) is removed at the start, not mistaken for this run's selected models."""
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg")
    straight = engine.run_training(cfg, tmp_path / "straight", progress=False)
    out = tmp_path / "run"
    out.mkdir()
    checkpoint.save({"all": {"models": {}, "predictions": {}}}, out / "selection-v1.pt")
    (out / ".checkpoint.pt.abc123.tmp").write_bytes(b"half")
    assert engine.run_training(cfg, out, progress=False)["test"] == straight["test"]
    assert not list(out.glob("selection-v*.pt")) and not list(out.glob(".*.tmp"))


def test_a_full_disk_names_the_file_and_round_and_leaves_no_orphan(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg")
    real_save = checkpoint.save

    def save(obj, path):
        if path.name == "checkpoint.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(checkpoint, "save", save)
    with pytest.raises(DataError, match=r"round 1: could not write .*/run/checkpoint.pt: No space left on device"):
        engine.run_training(cfg, tmp_path / "run", progress=False)
    assert not list((tmp_path / "run").glob("selection-v*.pt"))


def test_changing_checkpoint_every_keeps_a_killed_runs_checkpoint(tmp_path, tiny_task, monkeypatch, caplog):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedprox", rounds=4, method_params={"mu": 0.1})
    straight = engine.run_training(cfg, tmp_path / "straight", progress=False, checkpoint_every=1)
    interrupt_after_round(cfg, tmp_path / "run", monkeypatch, round_index=2)
    with caplog.at_level("INFO", logger="fedmedbench.engine"):
        engine.run_training(cfg, tmp_path / "run", progress=False, checkpoint_every=3)
    assert "after round 2" in caplog.text
    assert (tmp_path / "run" / "final.json").read_text() == (tmp_path / "straight" / "final.json").read_text()
    assert straight["config"] == json.loads((tmp_path / "run" / "final.json").read_text())["config"]


def test_a_global_method_can_be_selected_per_client(tmp_path, tiny_task):
    """PRR-FL's tables: every row selected per client (client k picks the round whose global model
    scores best on its own validation split), so rows differ by method, not by selection rule."""
    store, split = tiny_task
    final = engine.run_training(
        tiny_run_config(store, split, "fedavg", rounds=4, selection_scope="per_client"),
        tmp_path / "run",
        progress=False,
    )
    assert final["selection"]["per_client"] is True
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    val = history[(history["split"] == "val") & (history["metric"] == "dice_paper")]
    for client, rounds in final["selection"]["best_round"].items():
        scores = val[val["client"] == client].set_index("round")["value"]
        assert rounds == int(scores.idxmax()), client  # first best round of its own validation curve
        assert final["val"][client]["dice_paper"] == scores.max()
    pooled = engine.run_training(tiny_run_config(store, split, "fedavg", rounds=4), tmp_path / "pooled", progress=False)
    assert isinstance(pooled["selection"]["best_round"], int)


def test_drop_last_drops_the_last_partial_batch_only():
    import torch

    from fedmedbench.fl.data import SplitData, train_batches

    split = SplitData(np.zeros((10, 4, 4, 3), np.uint8), np.zeros((10, 4, 4), np.uint8), np.arange(10), np.zeros(10))
    sizes = lambda drop: [
        len(y) for _, y in train_batches(split, 4, torch.Generator().manual_seed(0), "none", 1.0, drop_last=drop)
    ]  # noqa: E731
    assert sizes(False) == [4, 4, 2] and sizes(True) == [4, 4]
    small = SplitData(split.images, split.labels, np.arange(3), np.zeros(3))
    assert [len(y) for _, y in train_batches(small, 4, torch.Generator(), "none", 1.0, drop_last=True)] == [
        3
    ]  # never an empty epoch
