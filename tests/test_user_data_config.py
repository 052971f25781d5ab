"""A user's own data in the config: a task needs only `dataset` and `kind`; the rest comes from the
per-kind defaults and the sites found on disk; mistakes are named when the DAG is built."""

from pathlib import Path

import pytest

from fedmedbench import config as cfgmod
from fedmedbench.data.folders import write_example
from fedmedbench.errors import FedmedbenchError

ROOT = Path(__file__).resolve().parents[1]
BASE = cfgmod.load_config(ROOT / "config" / "config.yaml")


def user_config(root, task=None, data=None):
    change = {
        "data": {
            "mysites": {
                "family": "folders",
                "root": str(root),
                "kind": "segmentation",
                "mask_values": {0: 0, 128: 1, 255: 2},
                **(data or {}),
            }
        },
        "tasks": {"mysites": {"dataset": "mysites", "kind": "segmentation", **(task or {})}},
        "experiments": {
            "mine": {"title": "mine", "task": "mysites", "runs": ["fedavg"], "seeds": [0], "metric": "dice_paper"}
        },
        "selected_experiments": ["mine"],
    }
    return cfgmod.deep_merge(BASE, change)


def test_a_task_on_user_data_gets_the_kind_defaults_and_the_sites_found(tmp_path):
    write_example(tmp_path / "data", sites=("north", "south", "west"))
    config = user_config(tmp_path / "data", task={"rounds": 7, "optimizer": {"lr": 0.5}})
    cfgmod.complete_user_data(config)
    cfgmod.validate(config)
    task = config["tasks"]["mysites"]
    assert task["clients"] == task["client_labels"] == ["north", "south", "west"]
    assert task["protocol"] == "default" and config["data"]["mysites"]["protocols"] == {"default": {}}
    assert task["model"] == {"name": "unet", "init_features": 32, "in_channels": 3, "num_classes": 3}
    assert task["rounds"] == 7 and task["optimizer"] == {
        "name": "adam",
        "lr": 0.5,
        "betas": [0.9, 0.99],
        "weight_decay": 1.0e-4,
    }
    assert (
        task["loss"] == "dice_ce" and task["selection_metric"] == "dice_fg"
    )  # foreground Dice: background would flatter a small structure
    run = cfgmod.resolve_run(config, "mysites", "fedavg", 0)
    assert run["data"]["store"].endswith("data/mysites/default/store")


def test_classification_defaults(tmp_path):
    made = write_example(tmp_path / "data", kind="classification")
    config = cfgmod.deep_merge(BASE, {
        "data": {"cls": {"family": "folders", "root": str(tmp_path / "data"), "kind": "classification", "classes": list(made["options"]["classes"])}},
        "tasks": {"cls": {"dataset": "cls", "kind": "classification"}},
    })  # fmt: skip
    cfgmod.complete_user_data(config)
    cfgmod.validate(config)
    task = config["tasks"]["cls"]
    assert task["model"]["name"] == "densenet" and task["model"]["num_classes"] == len(made["options"]["classes"])
    assert (
        task["loss"] == "ce" and task["optimizer"]["name"] == "sgd" and task["clients"] == ["siteA", "siteB", "siteC"]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data": {"root": "/no/such/folder"}}, "/no/such/folder: the data root does not exist"),
        (
            {"task": {"kind": "classification"}},
            "tasks.mysites.kind: 'classification', but data.mysites holds segmentation data",
        ),
        ({"data": {"mask_value": {0: 0}}}, "unknown key 'mask_value' (did you mean 'mask_values'?)"),
    ],
)
def test_user_data_mistakes_are_named_at_dag_time(tmp_path, change, message):
    write_example(tmp_path / "data")
    config = user_config(tmp_path / "data", task=change.get("task"), data=change.get("data"))
    with pytest.raises(FedmedbenchError) as err:
        cfgmod.complete_user_data(config)
        cfgmod.validate(config)
    assert message in str(err.value)


def test_a_data_section_that_is_no_family_is_named():
    config = cfgmod.deep_merge(BASE, {"data": {"mysites": {"synthetic": False}}})
    with pytest.raises(FedmedbenchError, match="data.mysites: not a built-in dataset family .*set `family: folders`"):
        cfgmod.validate(config)
