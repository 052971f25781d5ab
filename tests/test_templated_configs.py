"""`with-jobserver` refuses a YTE template (`__use_yte__`) in any YAML file or profile folder its
command line names, and in the config files such a profile lists, before Snakemake could run it."""

from __future__ import annotations

import pytest

from fedmedbench import config as fmb
from fedmedbench.errors import ConfigError

YTE = "__use_yte__: true\nrun_name: yte\n"


def test_every_yaml_file_and_profile_folder_named_is_read_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "overlay.yaml").write_text(YTE)
    (tmp_path / "wp").mkdir()
    (tmp_path / "wp" / "config.yaml").write_text("configfile: [plain.yaml, overlay.yaml]\n")
    (tmp_path / "plain.yaml").write_text("run_name: x\n")
    for command in (
        ["snakemake", "--configfile=overlay.yaml"],
        ["snakemake", "--configfiles", "plain.yaml", "overlay.yaml"],
        ["python", "-m", "snakemake", "--workflow-profile", "wp"],
    ):  # the profile lists it
        with pytest.raises(ConfigError, match=r"^overlay\.yaml: __use_yte__: asks Snakemake to run the Python"):
            fmb.refuse_templated_configs(command)
    # Plain files, other arguments, an option without a value, a script too long to be a path: nothing to refuse.
    fmb.refuse_templated_configs(
        ["snakemake", "--cores", "1", "--configfile", "plain.yaml", "--forceall", "-c", "x" * 5000]
    )
