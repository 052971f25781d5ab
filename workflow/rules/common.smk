# All Python helpers of the workflow: config validation, paths, target lists, params.
import json
import re
import shlex
import sys
from pathlib import Path

# The checkout: this file is workflow/rules/common.smk (the catalog's layout), two folders down.
# Taken from this file, not from workflow.basedir (the main Snakefile's folder), so that a workflow
# using this one as a module (`module: snakefile: <checkout>/workflow/Snakefile`) finds src/ and
# resources/ here too.
REPO = Path(str(workflow.current_basedir)).parents[1]
SRC = REPO / "src"
sys.path.insert(0, str(SRC))

from fedmedbench import config as fmb  # noqa: E402  (light: no torch)
from fedmedbench.data import is_archive, load_family  # noqa: E402
from fedmedbench.data.download import local_source  # noqa: E402

# Read by our reader first, so a YAML syntax error is one line with file, line and column
# (Snakemake's own message names neither), and a config asking Snakemake to evaluate Python
# (`__use_yte__`) is refused before the `configfile:` below lets Snakemake read it.
fmb.read_yaml(fmb.DEFAULT_CONFIG)
# Overlays given with --configfile: Snakemake read them (and ran a YTE template in them) before
# this file runs; refused all the same so that such a run stops here. `fedmedbench
# with-jobserver snakemake ...` refuses them before Snakemake starts (docs/engineering.md).
for overlay in workflow.configfiles:
    fmb.read_yaml(overlay)


configfile: "config/config.yaml"


# A user's own data (`family: folders`): its protocol, and its tasks' per-kind defaults and sites.
fmb.complete_user_data(config, "config")
# A typo names the key and its closest valid spelling.
fmb.validate(config, "config")

ROOT = str(fmb.results_root(config))
RESOURCES = str(REPO / "resources")
# Jobs run `python -m fedmedbench` from this checkout, so neither the venv nor a conda env needs the
# package installed.
# (The prefix is formatted once more per job, hence the doubled braces.)
shell.prefix(
    f"export PYTHONPATH={shlex.quote(str(SRC))}${{{{PYTHONPATH:+:$PYTHONPATH}}}}; "
)


def name_pattern(names):
    """A wildcard constraint matching exactly these names (never matching when there are none)."""
    return "|".join(re.escape(n) for n in names) or "(?!x)x"


wildcard_constraints:
    task=name_pattern(config["tasks"]),
    dataset=name_pattern(config["data"]),
    run=r"[a-z0-9_]+(-[A-Za-z0-9_.]+)?",
    seed=r"\d+",
    file=r"[^/]+",
    archive=r"[^/]+\.(zip|tar|tar\.gz|tgz)",
    protocol=r"[a-z0-9_]+",
    experiment=name_pattern(config["experiments"]),


# --- data ---------------------------------------------------------------------------------------
def family(dataset):
    return load_family(fmb.family_of(config, dataset))


def family_name(wildcards):
    return fmb.family_of(config, wildcards.dataset)


def user_data(dataset):
    return fmb.family_of(config, dataset) == "folders"


def user_data_options(wildcards):
    """`--options JSON` for a user's own data (`family: folders`), else nothing."""
    if not user_data(wildcards.dataset):
        return ""
    options = json.dumps(fmb.folders_options(config, wildcards.dataset), sort_keys=True)
    return f"--options {shlex.quote(options)}"


def user_data_listing(wildcards):
    """The files of a user's data folder (names, sizes, contents; symlinked site folders followed):
    an edit there re-runs preprocessing, even one that keeps every size and time (two masks swapped).
    Its split_csv, read by the split alone, is left out. The content hashes are cached under the
    run's results (read and written by no job, so it re-runs nothing): a DAG build reads
    only the files that changed since the last one.
    """
    if not user_data(wildcards.dataset):
        return ""
    from fedmedbench.data.digest import listing_digest
    from fedmedbench.data.skipped import mark_results

    # Results written inside the data root are marked before it is listed: neither the listing nor
    # preprocessing takes them for data (fedmedbench.data.skipped).
    for folder in (Path(ROOT).parent, ROOT):
        mark_results(folder)
    section = config["data"][wildcards.dataset]
    listing = listing_digest(
        section["root"],
        exclude=[section["split_csv"]] if section.get("split_csv") else [],
        cache=f"{ROOT}/.cache/listing/{wildcards.dataset}.json",
    )
    # Preprocessing reads groups_csv wherever it lies: its content joins the listing.
    groups_csv = section.get("groups_csv")
    if groups_csv and Path(groups_csv).is_file():
        from fedmedbench.data.digest import file_digest

        listing += f" groups_csv {file_digest(groups_csv)}"
    return listing


def raw_files(dataset):
    return [spec.filename for spec in family(dataset).DOWNLOADS]


def file_override(dataset, filename):
    return config["data"][dataset].get("files", {}).get(filename) or {}


def download_source(wildcards, input):
    """A manually downloaded file wins; the demo fetches its synthetic twin via file://."""
    if config["data"][wildcards.dataset]["synthetic"]:
        return (Path(input.synthetic) / wildcards.file).resolve().as_uri()
    override = file_override(wildcards.dataset, wildcards.file)
    spec = {s.filename: s for s in family(wildcards.dataset).DOWNLOADS}[wildcards.file]
    return override.get("archive") or override.get("source") or spec.url


def download_inputs(wildcards):
    if config["data"][wildcards.dataset]["synthetic"]:
        return {"synthetic": f"{ROOT}/data/{wildcards.dataset}/synthetic"}
    return {}


def fetch_options(wildcards):
    """`--sha256` when pinned, and for a file the user downloaded by hand (`archive`, or a local
    `source`) without a pinned hash `--source-stamp`: its path, size and modification time (not its
    content: hashing a 10 GB archive at every DAG build would take minutes; docs/engineering.md).
    Replacing the file re-runs its download; the job checks it copies the file the DAG saw.
    (`download_source` takes `input`, so Snakemake compares none of it. A pinned hash fixes the
    content: a replaced file gives the same download or fails, so it needs no stamp.)
    """
    spec = {s.filename: s for s in family(wildcards.dataset).DOWNLOADS}[wildcards.file]
    sha = file_override(wildcards.dataset, wildcards.file).get("sha256") or spec.sha256
    if config["data"][wildcards.dataset]["synthetic"]:
        return ""  # the synthetic twin is an input; pinned hashes are of the real files
    options = f"--sha256 {sha}" if sha else ""
    override = file_override(wildcards.dataset, wildcards.file)
    named = override.get("archive") or override.get("source")
    local = local_source(named) if named and not sha else None
    if local is not None:
        from fedmedbench.data.digest import file_stamp

        options += f" --source-stamp {shlex.quote(file_stamp(local))}"
    return options.strip()


def synthetic_options(wildcards):
    return json.dumps(config["data"][wildcards.dataset].get("synthetic_options", {}))


def synthetic_seed(wildcards):
    return config["data"][wildcards.dataset].get("synthetic_seed", 0)


def extracted_raw(dataset):
    """Each raw file as preprocessing reads it: archives extracted, single files as they are."""
    return {
        name: (
            f"{ROOT}/data/{dataset}/extracted/{name}"
            if is_archive(name)
            else f"{ROOT}/data/{dataset}/raw/{name}"
        )
        for name in raw_files(dataset)
    }


def preprocess_inputs(wildcards):
    return extracted_raw(wildcards.dataset)


def raw_arguments(wildcards, input):
    return " ".join(
        shlex.quote(f"{name}={input[name]}") for name in raw_files(wildcards.dataset)
    )


def protocol_spec(wildcards):
    protocols = config["data"][wildcards.dataset].get("protocols", {})
    if wildcards.protocol not in protocols:
        raise ValueError(
            f"data.{wildcards.dataset}.protocols has no {wildcards.protocol!r} (have: {sorted(protocols)})"
        )
    return protocols[wildcards.protocol] or {}


def preprocess_options(wildcards):
    if user_data(wildcards.dataset):
        return user_data_options(wildcards)
    spec = protocol_spec(wildcards)
    options = f"--size {spec['image_size']}" if spec.get("image_size") else ""
    if spec.get("expect_real_counts"):
        options += " --expect-real-counts"
    return options


def split_options(wildcards):
    if user_data(wildcards.dataset):
        # Its seed and fractions are options of the data section; a split_csv's content (not only
        # its path) is in the job's view, and the job checks it reads what the DAG saw.
        options = user_data_options(wildcards)
        split_csv = config["data"][wildcards.dataset].get("split_csv")
        if split_csv and Path(split_csv).is_file():
            from fedmedbench.data.digest import file_digest

            options += f" --split-csv-digest {file_digest(split_csv)}"
        return options
    split = protocol_spec(wildcards).get("split", {})
    return f"--permutation {split.get('permutation', 'default')} --seed {split.get('seed', 0)}"


def prepared_datasets():
    """The split file of every (dataset, protocol) a selected experiment's task reads (a config that
    selects only its own experiments never downloads the papers' data)."""
    tasks = {t for exp in SELECTED for t in fmb.experiment(config, exp).task_names()}
    return sorted({str(fmb.task_data_dir(config, t) / "split.csv") for t in tasks})


# --- training -----------------------------------------------------------------------------------
def train_inputs(wildcards):
    data_dir = fmb.task_data_dir(config, wildcards.task)
    return {"store": str(data_dir / "store"), "split": str(data_dir / "split.csv")}


def run_dir(wildcards, output):
    return str(Path(output.final).parent)


def checkpoint_every(wildcards):
    return fmb.checkpoint_every(config, wildcards.task)


def hook_timeout(wildcards):
    """The task's hook_timeout_s as a resource (a string: Snakemake's resources are integers or
    strings; "0": no limit). Not in the run config: it cannot change a number."""
    return str(fmb.hook_timeout_s(config, wildcards.task) or 0)


def run_config_json(wildcards):
    """The fully resolved run config: a change of any setting re-runs exactly the affected jobs."""
    cfg = fmb.resolve_run(config, wildcards.task, wildcards.run, int(wildcards.seed))
    return json.dumps(cfg, sort_keys=True)


# --- experiments, tables, figures, report -------------------------------------------------------
# `selected_experiments` (default: all) limits what `rule all` and the report make.
SELECTED = config.get("selected_experiments") or list(config["experiments"])


def experiments_of(kind):
    return [e for e in SELECTED if fmb.experiment_kind(config, e) == kind]


def run_files(experiment, name):
    return [
        f"{ROOT}/train/{task}/{run}/seed{seed}/{name}"
        for task, run, seed in fmb.experiment_runs(config, experiment)
    ]


def experiment_finals(wildcards):
    return run_files(wildcards.experiment, "final.json")


def experiment_histories(wildcards):
    return run_files(wildcards.experiment, "history.csv")


def experiment_predictions(wildcards):
    return run_files(wildcards.experiment, "predictions.npz")


def experiment_stores(wildcards):
    spec = config["experiments"][wildcards.experiment]
    return [str(fmb.task_data_dir(config, task) / "store") for task in spec["tasks"]]


def experiment_splits(wildcards):
    spec = config["experiments"][wildcards.experiment]
    return [
        str(fmb.task_data_dir(config, task) / "split.csv") for task in spec["tasks"]
    ]


def task_synthetic(task):
    """Whether a task reads its dataset's synthetic twin (the demo): its figures and tables say so."""
    return bool(
        config["data"][config["tasks"][task]["dataset"]].get("synthetic", False)
    )


def experiment_synthetic(wildcards):
    names = fmb.experiment(config, wildcards.experiment).task_names()
    return any(task_synthetic(t) for t in names)


def experiment_json(wildcards):
    spec = config["experiments"][wildcards.experiment]
    names = fmb.experiment(config, wildcards.experiment).task_names()
    # `synthetic` per task: the report jobs mark a figure or table drawn from synthetic data.
    tasks = {
        t: {**fmb.task_spec_for_params(config, t), "synthetic": task_synthetic(t)}
        for t in names
    }
    return json.dumps({**spec, "task_specs": tasks}, sort_keys=True)


def experiment_figure(experiment):
    kind = fmb.experiment_kind(config, experiment)
    suffix = "_convergence" if kind == "table" else ""
    return f"{ROOT}/figures/{experiment}{suffix}.png"


def all_finals(wildcards=None):
    return sorted({f for exp in SELECTED for f in run_files(exp, "final.json")})


def all_figures(wildcards=None):
    return [experiment_figure(exp) for exp in SELECTED]


def paper_tables_digest(wildcards=None):
    """The content of every paper table a selected experiment compares with: editing one re-runs
    the report (the folder is an input, but its time does not change when a file in it is edited).
    """
    from fedmedbench.data.digest import file_digest

    tables = sorted(
        {
            config["experiments"][name]["paper_table"]
            for name in SELECTED
            if config["experiments"][name].get("paper_table")
        }
    )
    return " ".join(
        f"{name}:{file_digest(Path(RESOURCES) / 'paper_tables' / name)}"
        for name in tables
    )


def experiments_json(wildcards=None):
    experiments = {
        name: {
            **spec,
            "kind": fmb.experiment_kind(config, name),
            "figure": experiment_figure(name),
        }
        for name, spec in config["experiments"].items()
        if name in SELECTED
    }
    return json.dumps(experiments)  # config order = report order


# The rules that draw an experiment of each kind (the others: `<kind>_figure`).
KIND_RULES = {"table": ("table", "convergence_figure"), "ood_table": ("ood_table",)}


def products(name, **wildcards):
    """Every file a job of rule `name` declares, its wildcards filled in. Snakemake re-runs a job for a
    missing output only when some job (or `all`) asks for that very file: `all` asks for every
    output of the training, evaluation and report jobs, so a deleted model_best.pt or figure CSV
    is made again."""
    return [expand(pattern, **wildcards)[0] for pattern in getattr(rules, name).output]


def all_targets():
    # The data jobs' records (a download's .sha256, preprocessing's counts.json) are not asked
    # for: remaking one would redo a download or a store, and so every training job after it.
    targets = [f"{ROOT}/report.md"] + prepared_datasets()
    for exp in SELECTED:
        kind = fmb.experiment_kind(config, exp)
        for name in KIND_RULES.get(kind, (f"{kind}_figure",)):
            targets += products(name, experiment=exp)
        if kind == "table":
            targets += products("collect_metrics", experiment=exp)
        for task, run, seed in fmb.experiment_runs(config, exp):
            targets += products("train", task=task, run=run, seed=seed)
    return list(dict.fromkeys(targets))
