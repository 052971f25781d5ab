"""Command line: ``fedmedbench <command>``. Every pipeline step is a command, so any job can be rerun
by hand exactly as Snakemake ran it (the command is in the job's log). Heavy imports (torch,
SimpleITK, matplotlib) happen inside the commands that need them, to keep start-up short."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

from fedmedbench import config as cfgmod
from fedmedbench import version_line
from fedmedbench.config import DEFAULT_CONFIG, Experiment
from fedmedbench.errors import ConfigError, DataError, FedmedbenchError, HookStopped, closest
from fedmedbench.federation.local import add_subcommand as add_federation_command  # light: no Flower, no torch

# Each command imports what it runs inside its own function (ruff's PLC0415 is off for this module,
# pyproject.toml): `--help`, the data steps and the report steps start without torch (~1.5 s) or
# Flower, and `--help` without pandas or matplotlib either.


class _CurrentStderr(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is when the record is written, not to the stream
    ``sys.stderr`` was when the handler was made. ``main`` runs in-process too (the tests, a job server's
    fork): a handler bound to the stderr of that moment (pytest's capture of one test) outlived it and
    every later record failed with ``--- Logging error --- ValueError: I/O operation on closed file``."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__/setStream assign it: always the current stderr
        pass


def _setup_logging(verbose: bool = False) -> None:
    """The root logger's one handler of ours (a second ``main`` in the same process replaces it, not
    adds to it); handlers that others installed (pytest's, a library's) stay and stay open."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _CurrentStderr)]:
        root.removeHandler(old)
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def config_files(paths: list[str]) -> list[str]:
    """The --configfile files, each checked to exist: the default config/config.yaml missing (a command
    run outside the checkout) says in one line where to run or what to pass."""
    for path in paths:
        if Path(path).is_file():
            continue
        if path == str(DEFAULT_CONFIG):
            raise ConfigError(
                f"--configfile: found no {DEFAULT_CONFIG} in {Path.cwd()}: run the command in the fedmedbench checkout, "
                f"or pass --configfile PATH/TO/{DEFAULT_CONFIG} [overlay.yaml ...]"
            )
        if not os.path.exists(path):
            raise ConfigError(f"--configfile: {path}: no such file (in {Path.cwd()})")
    return paths


def cmd_train(args) -> None:
    from fedmedbench.fl.engine import run_training

    if args.run_config:
        try:
            run_cfg = json.loads(args.run_config)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--run-config is not valid JSON: {err}") from None
    else:
        if not (args.config and args.task and args.run and args.seed is not None):
            raise SystemExit("train: give --run-config JSON, or --configfile FILE... --task --run --seed")
        config = cfgmod.load_config(*args.config)
        run_cfg = cfgmod.resolve_run(config, args.task, args.run, args.seed)
        if args.checkpoint_every is None:
            args.checkpoint_every = cfgmod.checkpoint_every(config, args.task)
        if args.hook_timeout_s is None:
            args.hook_timeout_s = cfgmod.hook_timeout_s(config, args.task)
    if args.hook_timeout_s is not None and not 0 <= args.hook_timeout_s < float("inf"):  # NaN too
        raise ConfigError(
            f"--hook-timeout-s: expected a number of seconds > 0 (0: no limit), got {args.hook_timeout_s}"
        )
    from fedmedbench.fl.data import refuse_random_pixels

    refuse_random_pixels(run_cfg)  # a store made to time jobs, where the real data belong: one line, before any output
    out = Path(args.out)
    logging.getLogger("fedmedbench").info("run config: %s", json.dumps(run_cfg, sort_keys=True))
    if (
        run_cfg.get("runtime") == "flower-simulation"
    ):  # the same round loop under Flower's simulation runtime (docs/federation.md)
        from fedmedbench.federation.simulation import run_simulated as run_training
    from fedmedbench.fl.hookwatch import watching

    with watching(args.hook_timeout_s):  # SIGTERM, Ctrl-C or the timeout in a method hook: a line naming it
        final = run_training(
            run_cfg,
            out,
            device=args.device,
            threads=args.threads,
            progress=not args.no_progress,
            checkpoint_every=args.checkpoint_every or 1,
            checkpoint_every_seconds=args.checkpoint_every_seconds,
            data_workers=args.data_workers,
        )
    metric = final["primary_metric"]
    mean = sum(v[metric] for v in final["test"].values()) / len(final["test"])
    from fedmedbench.report.flags import print_score_summary

    # a flagged score is never printed bare: its mark, and a WARNING line per run, site and seed
    print_score_summary(
        final,
        f"{final['task']}/{final['run']}/seed{final['seed']}: mean test {metric} {mean:.4f} (selected on val: {final['selection']['best_round']})",
    )


def cmd_estimate(args) -> None:
    from fedmedbench import estimate
    from fedmedbench.fl.placement import pick_device

    # Before any config is read or any round timed: a count that cannot be, one line each.
    for option, value, least in (
        ("--rounds-to-time", args.rounds_to_time, 2),
        ("--gpus", args.gpus, 1),
        ("--jobs-per-gpu", args.jobs_per_gpu, 1),
        ("--threads", args.threads, 1),
        ("--data-workers", args.data_workers, 0),
    ):
        if value is not None and value < least:
            raise ConfigError(f"{option} must be at least {least} (got {value})")
    if not 0 < args.sharing_gain < float("inf"):  # NaN too
        raise ConfigError(
            f"--sharing-gain must be above 0: the throughput of --jobs-per-gpu jobs sharing a GPU over one job's (got {args.sharing_gain})"
        )
    config = cfgmod.load_config(*args.config)
    experiments = args.experiments or config.get("selected_experiments") or list(config["experiments"])
    for name in experiments:
        if name not in config["experiments"]:
            raise ConfigError(f"--experiments: unknown experiment {name!r}")
    jobs = estimate.jobs_of(config, experiments)
    device, claim = pick_device(args.device)
    if claim is not None:
        claim.release()
    evaluation: dict = {}
    timings = estimate.measure(
        config, jobs, args.rounds_to_time, str(device), args.threads, args.data_workers, evaluation
    )
    rows = estimate.project(jobs, timings, args.gpus, args.jobs_per_gpu, args.sharing_gain)
    print(
        estimate.format_table(
            rows,
            str(device) if device.type == "cpu" else torch_device_name(device),
            args.gpus,
            args.jobs_per_gpu,
            args.sharing_gain,
            args.rounds_to_time,
        )
    )
    print()
    print(estimate.format_evaluation(jobs, timings, evaluation, args.rounds_to_time))


def torch_device_name(device) -> str:
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})"


def cmd_with_jobserver(args) -> None:
    from fedmedbench.config import refuse_templated_configs
    from fedmedbench.jobserver import with_jobserver

    if not args.cmd:
        raise ConfigError("with-jobserver: give the command to run, e.g. with-jobserver snakemake --cores 2")
    # Snakemake runs a YTE template in a profile or --configfile while parsing its arguments, before
    # the Snakefile could refuse it: refused here first.
    refuse_templated_configs(args.cmd)
    raise SystemExit(with_jobserver(args.cmd, main, warm_up_jobs))


def warm_up_jobs() -> None:
    """What the job server imports once, before forking its jobs: what every training job imports,
    without running any tensor operation."""
    import torch
    import torch._dynamo  # noqa: F401  (imported by the first optimizer of every job)

    import fedmedbench.fl.engine  # noqa: F401
    import fedmedbench.report.figures  # noqa: F401  (matplotlib: ~0.4 s for each of the demo's ~20 figure jobs)
    from fedmedbench import registry

    for name in registry.builtin_methods():  # plug-ins are imported by each job: their edits count
        registry.load_method(name)
    torch.optim.SGD([torch.nn.Parameter(torch.empty(0))], lr=0.1)  # caches the optimizer's dynamo wrappers


def cmd_methods(args) -> None:
    """Every method: built in, installed plug-ins (entry points) and the config's `module:` plug-ins;
    per method what it is, its paper, where its BN statistics live and its parameters."""
    from fedmedbench.registry import (
        available_methods,
        bn_statistics,
        find_method,
        is_personalized,
        method_defaults,
        summary,
    )

    configured = {}
    if args.config:
        config = cfgmod.load_config(*args.config)
        configured = {
            name: section["module"] for name, section in config["methods"].items() if (section or {}).get("module")
        }
    rows = [find_method(name) for name in available_methods()] + [
        find_method(name, module) for name, module in configured.items()
    ]
    width = max(len(ref.name) for ref in rows)
    indent = " " * (width + 2)
    for ref in rows:
        module = None if ref.builtin else ref.module
        params = ", ".join(f"{k}={_value_text(v)}" for k, v in method_defaults(ref.name, module).items()) or "-"
        personalized = "personalized" if is_personalized(ref.name, module) else "global"
        # Its module, not its file: no path of this machine in a listing people paste into reports.
        origin = ref.origin if ref.origin.startswith("config:") else f"{ref.origin}, {ref.module}"
        description, paper = summary(ref.name, module)
        print(f"{ref.name:<{width}}  {personalized:<12}  {origin}")
        print(f"{indent}{description}")
        if paper:
            print(f"{indent}paper: {paper}")
        print(f"{indent}BN statistics: {bn_statistics(ref.name, module)}")
        print(f"{indent}parameters: {params}")


def _value_text(value) -> str:
    """A parameter's default; a float to 6 significant digits (0.333333, 1e-12), still a float (1.0)."""
    return repr(float(f"{value:.6g}")) if isinstance(value, float) else repr(value)


def cmd_new_method(args) -> None:
    from fedmedbench.new_method import new_method

    out = args.out or args.name  # ./NAME, as `flwr new` does
    written = new_method(args.name, Path(out))
    # ./myfed rather than myfed in the hints: it reads as a folder, not as a name on the package index.
    shown = out if Path(out).is_absolute() or out.startswith(".") else f"./{out}"
    print(
        f"wrote {len(written)} files into {shown}: `pip install -e {shown}` registers {args.name!r}; `pytest {shown}` trains it for two rounds"
    )


def cmd_fetch(args) -> None:
    from fedmedbench.data import load_family
    from fedmedbench.data.download import fetch

    specs = {spec.filename: spec for spec in load_family(args.dataset).DOWNLOADS}
    spec = specs.get(Path(args.dest).name)
    fetch(
        args.source,
        Path(args.dest),
        sha256=args.sha256,
        log=logging.getLogger("fedmedbench.fetch").info,
        manual_step=spec.manual_step if spec else None,
        source_stamp=args.source_stamp,
    )


def cmd_extract(args) -> None:
    from fedmedbench.data.archive import safe_extract
    from fedmedbench.data.staging import cleaned_up_on_sigterm

    with cleaned_up_on_sigterm("extract"):
        safe_extract(Path(args.archive), Path(args.out))


def cmd_synthesize(args) -> None:
    from fedmedbench.data import load_family

    info = load_family(args.dataset).write_synthetic(Path(args.out), seed=args.seed, **json.loads(args.options))
    logging.getLogger("fedmedbench.synthetic").info(
        "wrote the synthetic %s release to %s: %s", args.dataset, args.out, info
    )


def cmd_preprocess(args) -> None:
    from fedmedbench.data import load_family
    from fedmedbench.data.staging import cleaned_up_on_sigterm
    from fedmedbench.data.store import atomic_write_text

    raw = dict(item.split("=", 1) for item in args.raw)
    log = logging.getLogger(f"fedmedbench.{args.dataset}").info
    options = {"options": json.loads(args.options)} if args.options else {}  # a user's own data (folders)
    with cleaned_up_on_sigterm("preprocess"):
        counts = load_family(args.dataset).preprocess(
            raw,
            Path(args.out),
            args.protocol,
            expect_real_counts=args.expect_real_counts,
            size=args.size,
            log=log,
            **options,
        )
    if args.counts:
        atomic_write_text(Path(args.counts), json.dumps(counts, indent=2) + "\n")


def cmd_check_data(args) -> None:
    """What the pipeline will understand of each data section, before anything trains; exit 1 on any problem."""
    from fedmedbench.data.folders import inspect

    # Merged but not completed: completing a `folders` section reads its layout, whose problems are
    # what this command reports (one line each) instead of stopping at the first.
    config: dict = {}
    for path in args.config:
        config = cfgmod.deep_merge(config, cfgmod.read_yaml(path))
    data = config.get("data") or {}
    if args.dataset and args.dataset not in data:
        raise ConfigError(
            f"--dataset: {args.dataset!r} is not a section of data{closest(args.dataset, data)}; have: {', '.join(data)}"
        )
    failed = False
    for name in [args.dataset] if args.dataset else list(data):
        family = cfgmod.family_of(config, name)
        if family != "folders":
            protocols = (data[name] or {}).get("protocols") or {}
            counts = (
                [cfgmod.results_root(config) / "data" / name / p / "counts.json" for p in protocols]
                if config.get("run_name")
                else []
            )
            print(inspect.builtin_line(name, family, counts))
            continue
        # The image size must suit the model of every task on this data (the kind's default model, as
        # complete_user_data gives it, under the task's own keys), or the kind's default model when no
        # task names the data yet.
        kind = (data[name] or {}).get("kind", "segmentation")
        models = {
            task: cfgmod.deep_merge(
                cfgmod.KIND_DEFAULTS.get(spec.get("kind", kind), {}).get("model", {}), spec.get("model") or {}
            )
            for task, spec in (config.get("tasks") or {}).items()
            if isinstance(spec, dict) and spec.get("dataset") == name
        }
        models = models or {None: cfgmod.KIND_DEFAULTS.get(kind, {}).get("model", {})}

        def size_problem(height: int, width: int, models=models) -> str | None:
            return next(
                filter(None, (cfgmod.model_size_problem(model, height, width, task) for task, model in models.items())),
                None,
            )

        try:
            report = inspect.inspect_folders(cfgmod.folders_options(config, name), name, size_problem=size_problem)
        except ConfigError as err:
            print(f"data.{name}: problem: {err}")
            failed = True
            continue
        print("\n".join(report.lines()))
        failed |= bool(report.problems)
    raise SystemExit(1 if failed else 0)


def cmd_split(args) -> None:
    from fedmedbench.data import load_family

    if args.split_csv_digest:  # the workflow keyed this job on the split_csv's content: the same content is split
        from fedmedbench.data.digest import file_digest

        path = json.loads(args.options or "{}").get("split_csv")
        now = file_digest(path) if path else None
        if now != args.split_csv_digest:
            raise DataError(
                f"{path}: split_csv changed after the workflow planned this job (content digest {now}, "
                f"planned {args.split_csv_digest}); run the workflow again"
            )
    if args.options:  # a user's own data (folders): seed and fractions are its options
        load_family(args.dataset).split(
            Path(args.store),
            Path(args.out),
            args.protocol,
            options=json.loads(args.options),
            log=logging.getLogger("fedmedbench.split").info,
        )
    else:
        load_family(args.dataset).split(
            Path(args.store), Path(args.out), args.protocol, permutation=args.permutation, seed=args.seed
        )


def _load_finals(paths: list[str]) -> list[dict]:
    from fedmedbench.report.inputs import read_final

    return [read_final(path) for path in paths]


def cmd_collect(args) -> None:
    """All runs' per-client metrics of an experiment in one long CSV (run, seed, client, split, metric)."""
    import pandas as pd

    from fedmedbench.data.store import atomic_write_text

    rows = []
    for final in _load_finals(args.finals):
        for split in ("val", "test"):
            for client, scores in final[split].items():
                for metric, value in scores.items():
                    rows.append(
                        {
                            "task": final["task"],
                            "run": final["run"],
                            "seed": final["seed"],
                            "client": client,
                            "split": split,
                            "metric": metric,
                            "value": value,
                        }
                    )
    atomic_write_text(Path(args.out), pd.DataFrame(rows).to_csv(index=False))


def _experiment_finals(exp: Experiment, finals: list[dict], paths: list[str]) -> list[dict]:
    """The finals as the table uses them: with ``select_on: test`` (the official Fed-LWR selection,
    a switch, off by default) each run's test scores at its best mean test round, from history.csv."""
    if exp.select_on == "val":
        return finals
    from fedmedbench.report.fedlwr import select_on_test
    from fedmedbench.report.inputs import read_history

    return [
        select_on_test(f, read_history(Path(p).with_name("history.csv"), f), exp.metric) for f, p in zip(finals, paths)
    ]


def cmd_table(args) -> None:
    from fedmedbench.report.flags import collect_flags
    from fedmedbench.report.inputs import is_synthetic
    from fedmedbench.report.tables import seed_summary, write_table

    exp = Experiment.from_dict(json.loads(args.experiment))
    finals = _experiment_finals(exp, _load_finals(args.finals), args.finals)
    summary = seed_summary(finals, exp.metric, sources=args.finals, std_row=exp.std_row)
    rows = [(run, exp.label(run)) for run in exp.runs]
    flags = collect_flags(finals, dict(rows))
    write_table(
        summary,
        Path(args.out_prefix),
        rows,
        caption=exp.title,
        metric=exp.metric,
        flags=flags,
        synthetic=is_synthetic(exp.task_specs, finals),
    )


def cmd_figure(args) -> None:
    from fedmedbench.report.figures import convergence
    from fedmedbench.report.inputs import finals_beside, histories_by_run, is_synthetic

    exp = Experiment.from_dict(json.loads(args.experiment))
    histories = histories_by_run(args.histories, exp.runs)
    # The finals as the table reads them: each run's selected round is marked at the table's Avg.
    finals = _experiment_finals(
        exp, finals_beside(args.histories), [str(Path(p).with_name("final.json")) for p in args.histories]
    )
    by_run = {run: [f for f in finals if f["run"] == run] for run in exp.runs}
    convergence(
        histories,
        exp.metric,
        Path(args.out_prefix),
        title=exp.title.split(":")[0] + ": convergence",
        labels=exp.labels,
        finals=by_run,
        synthetic=is_synthetic(exp.task_specs, finals),
    )


def cmd_sweep_figure(args) -> None:
    from fedmedbench.report.inputs import is_synthetic
    from fedmedbench.report.sweeps import sweep_figure, sweep_flags, sweep_points, sweep_y_label

    exp = Experiment.from_dict(json.loads(args.experiment))
    finals = _load_finals(args.finals)
    points = sweep_points(finals, exp.sweep_series(), exp.metric, exp.error)
    y_label = sweep_y_label(exp.metric, points)  # "1 seed" with one seed, not "mean over seeds"
    collapsed = sweep_flags(
        finals, exp.sweep_series(), exp.labels
    )  # a point of a collapsed model carries the tables' mark
    sweep_figure(
        points,
        Path(args.out_prefix),
        exp.title,
        exp.x_label,
        y_label,
        log_x=exp.log_x,
        error=exp.error,
        synthetic=is_synthetic(exp.task_specs, finals),
        collapsed=collapsed,
    )


def cmd_qualitative_figure(args) -> None:
    from fedmedbench.report.qualitative import load_rows, qualitative_figure

    exp = Experiment.from_dict(json.loads(args.experiment))
    by_task: dict[str, dict[str, Path]] = {}
    for path in map(Path, args.predictions):  # .../train/<task>/<run>/seed<k>/predictions.npz
        task, run = path.parts[-4], path.parts[-3]
        by_task.setdefault(task, {}).setdefault(run, path)  # first seed listed
    rows = []
    for task in exp.tasks:
        spec = exp.task_specs[task]
        clients = exp.clients.get(task, spec["clients"])
        files = {run: by_task[task][run] for run in exp.runs}
        rows += load_rows(
            files, task, clients, per_client=exp.per_client, centre_slice=spec.get("channels") == "slices"
        )
    columns = [(run, exp.label(run)) for run in exp.runs]
    from fedmedbench.report.inputs import finals_beside, is_synthetic

    qualitative_figure(
        rows,
        columns,
        Path(args.out_prefix),
        exp.title,
        synthetic=is_synthetic(exp.task_specs, finals_beside(args.predictions)),
    )


def cmd_ampnorm_figure(args) -> None:
    from fedmedbench.report.harmofl import ampnorm_figure, normalized_examples

    exp = Experiment.from_dict(json.loads(args.experiment))
    panels = {}
    for task, store in zip(exp.tasks, args.stores):
        clients = exp.task_specs[task]["clients"]
        panels[task] = normalized_examples(Path(store), Path(store).with_name("split.csv"), clients)
    from fedmedbench.report.inputs import is_synthetic

    # 2.5D MRI (channels = adjacent slices) shows its middle slice in grey, not as false colour
    slices = {task for task in exp.tasks if exp.task_specs[task].get("channels") == "slices"}
    ampnorm_figure(
        panels, Path(args.out_prefix), exp.title, centre_slice=slices, synthetic=is_synthetic(exp.task_specs)
    )


def cmd_layer_cka_figure(args) -> None:
    from fedmedbench.report.fedlwr import layer_cka_figure
    from fedmedbench.report.inputs import is_synthetic, read_run_history

    exp = Experiment.from_dict(json.loads(args.experiment))
    spec = exp.task_specs[exp.task]
    labels = dict(zip(spec["clients"], spec.get("client_labels") or spec["clients"]))
    final, history = read_run_history(args.histories[0])
    layer_cka_figure(
        history, Path(args.out_prefix), exp.title, labels=labels, synthetic=is_synthetic(exp.task_specs, [final])
    )


def cmd_fairness_curves(args) -> None:
    from fedmedbench.report.fedlwr import fairness_curves
    from fedmedbench.report.inputs import finals_beside, histories_by_run, is_synthetic

    exp = Experiment.from_dict(json.loads(args.experiment))
    histories = histories_by_run(args.histories, exp.runs)
    fairness_curves(
        histories,
        exp.metric,
        Path(args.out_prefix),
        exp.title,
        labels=exp.labels,
        synthetic=is_synthetic(exp.task_specs, finals_beside(args.histories)),
    )


def cmd_fairness_bars(args) -> None:
    from fedmedbench.report.fedlwr import fairness_bars
    from fedmedbench.report.flags import collect_flags
    from fedmedbench.report.inputs import is_synthetic
    from fedmedbench.report.tables import seed_summary

    exp = Experiment.from_dict(json.loads(args.experiment))
    finals = _experiment_finals(exp, _load_finals(args.finals), args.finals)
    summary = seed_summary(finals, exp.metric, sources=args.finals, std_row=True)
    flags = collect_flags(finals, exp.labels)  # a collapsed model's bars carry the tables' mark
    fairness_bars(
        summary,
        exp.runs,
        Path(args.out_prefix),
        exp.title,
        exp.metric,
        labels=exp.labels,
        flags=flags,
        synthetic=is_synthetic(exp.task_specs, finals),
    )


def cmd_ood_table(args) -> None:
    """PRR-FL Table 3: an OOD cohort's scores per method (table csv/md/tex + a bar figure)."""
    from fedmedbench.report.inputs import is_synthetic
    from fedmedbench.report.prrfl import ood_columns, ood_figure, ood_flags, ood_summary
    from fedmedbench.report.tables import write_table

    exp = Experiment.from_dict(json.loads(args.experiment))
    finals = _load_finals(args.finals)
    summary = ood_summary(finals, exp.cohort)
    rows = [(run, exp.label(run)) for run in exp.runs]
    synthetic = is_synthetic(exp.task_specs, finals)
    flags = ood_flags(finals, exp.cohort, dict(rows))  # a collapsed ensemble or model is marked as in every table
    write_table(
        summary, Path(args.out_prefix), rows, caption=exp.title, columns=ood_columns(), synthetic=synthetic, flags=flags
    )
    ood_figure(
        summary, exp.runs, Path(args.figure_prefix), exp.title, labels=exp.labels, synthetic=synthetic, flags=flags
    )


def cmd_retrogress_figure(args) -> None:
    from fedmedbench.report.inputs import count_test_items, finals_beside, histories_by_run, is_synthetic
    from fedmedbench.report.prrfl import retrogress_figure

    exp = Experiment.from_dict(json.loads(args.experiment))
    histories = histories_by_run(args.histories, exp.runs)
    finals = finals_beside(args.histories)  # n: the client's test images, which the figure states
    retrogress_figure(
        histories,
        exp.client,
        exp.metric,
        Path(args.out_prefix),
        exp.title,
        labels=exp.labels,
        n_test=count_test_items(finals, exp.client),
        synthetic=is_synthetic(exp.task_specs, finals),
    )


def _ood_comparison(exp: Experiment, finals: list[dict], paper_tables: str):
    """PRR-FL Table 3 next to the paper: our OOD F1 / AUC (mean of the clients' models, and the
    ensemble) against the paper's single OOD number per method."""
    import pandas as pd

    from fedmedbench.report.compare import compare, load_paper_table
    from fedmedbench.report.prrfl import OOD_METRICS, OOD_SCORINGS, ood_comparison_summary, ood_summary

    summary = ood_summary(finals, exp.cohort)
    paper = load_paper_table(Path(paper_tables) / exp.paper_table)
    ids = exp.paper_id_map()
    parts = []
    for suffix in OOD_SCORINGS.values():
        for name in OOD_METRICS.values():
            part = compare(ood_comparison_summary(summary, name + suffix), paper, ids, metric=name.lower())
            part["client"] = f"{exp.cohort} {name}{suffix}"
            parts.append(part)
    return pd.concat(parts, ignore_index=True).sort_values("run", key=lambda s: s.map(list(ids).index), kind="stable")


def split_counts(final: dict) -> list[str]:
    """Samples per client and split, from the split file the run trained on (the report says what
    each site held, built-in or a user's own data); none for a final.json without its run config."""
    from fedmedbench.data.store import read_split_csv

    path = final.get("config", {}).get("data", {}).get("split")
    if path is None:
        return []
    split = read_split_csv(path)
    counts = split.groupby(["client", "split"]).size()
    parts = [
        f"{label} {'/'.join(str(int(counts.get((client, part), 0))) for part in ('train', 'val', 'test'))}"
        for client, label in zip(final["clients"], final["client_labels"])
    ]
    return ["samples per client (train/val/test): " + ", ".join(parts)]


def cmd_report(args) -> None:
    from fedmedbench.report.compare import compare, load_paper_table, write_report
    from fedmedbench.report.equivalences import fednova_fedavg_note
    from fedmedbench.report.flags import collect_flags
    from fedmedbench.report.metric_names import metric_label
    from fedmedbench.report.tables import seed_summary, table_layout

    experiments = {
        name: Experiment.from_dict(spec, f"experiments.{name}") for name, spec in json.loads(args.experiments).items()
    }
    finals = _load_finals(args.finals)
    sections, seeds, rounds = [], set(), set()
    for exp in experiments.values():
        section = {"title": exp.title, "labels": exp.labels, "figure": exp.figure, "notes": exp.notes}
        if exp.kind == "table":
            runs = set(exp.runs)
            picked = [
                (f, p)
                for f, p in zip(finals, args.finals)
                if f["task"] == exp.task and f["run"] in runs and f["seed"] in exp.seeds
            ]
            picked = list(
                zip(_experiment_finals(exp, [f for f, _ in picked], [p for _, p in picked]), [p for _, p in picked])
            )
            summary = seed_summary(
                [f for f, _ in picked], exp.metric, sources=[p for _, p in picked], std_row=exp.std_row
            )
            seeds.update(f["seed"] for f, _ in picked)
            rounds.update(f["selection"]["rounds"] for f, _ in picked)
            description = picked[0][0]["metric_descriptions"].get(exp.metric)
            # The metric in words, never its key (report.metric_names), then how it is computed.
            section["metric_note"] = f"{metric_label(exp.metric)}, in %." + (
                f" {description[0].upper()}{description[1:]}." if description else ""
            )
            # Rows that are one computation say why (FedNova = FedAvg with equal local steps), computed from the finals.
            section["notes"] = (
                *exp.notes,
                *fednova_fedavg_note([f for f, _ in picked], exp.labels),
                *split_counts(picked[0][0]),
            )
            rows = [(run, exp.label(run)) for run in exp.runs]
            section["flags"] = collect_flags([f for f, _ in picked], dict(rows))
            if exp.paper_table:
                paper = load_paper_table(Path(args.paper_tables) / exp.paper_table)
                section["comparison"] = compare(summary, paper, exp.paper_id_map(), metric=exp.paper_metric)
            else:
                # A user's own experiment: no published table, so our per-site table alone (no
                # empty paper and Δ columns), as in tables/<experiment>.md.
                section["table"] = table_layout(summary, rows, flags=section["flags"])
        if exp.kind == "ood_table":
            picked = [
                f for f in finals if f["task"] == exp.task and f["run"] in set(exp.runs) and f["seed"] in exp.seeds
            ]
            seeds.update(f["seed"] for f in picked)
            rounds.update(f["selection"]["rounds"] for f in picked)
            section["metric_note"] = (
                "macro F1 and macro one-vs-rest AUC on the test-only cohort, scored with every client's selected model: "
                "the mean of the models' scores (`OOD F1`, `OOD AUC`, compared with the paper) and the ensemble of their "
                "averaged probabilities (`(ensemble)`, compared with the same published number)"
            )
            if exp.paper_table and picked:
                from fedmedbench.report.prrfl import ood_flags

                section["comparison"] = _ood_comparison(exp, picked, args.paper_tables)
                section["flags"] = ood_flags(
                    picked, exp.cohort, {run: exp.label(run) for run in exp.runs}, prefix=f"{exp.cohort} "
                )
        sections.append(section)
    synthetic = any(f.get("synthetic", False) for f in finals)
    write_report(
        sections, Path(args.out), synthetic=synthetic, run_info={"seeds": sorted(seeds), "rounds": sorted(rounds)}
    )


DESCRIPTION = (
    "Federated learning on medical images, from raw data to the papers' tables: a Snakemake pipeline "
    "(snakemake --cores 8 runs it), and these commands for people.\n\n"
    "The pipeline's steps, listed after the commands, are what its jobs run: a job's log shows the exact "
    "command, to rerun it by hand. fedmedbench COMMAND --help describes a command and its options."
)

INPUT_HELP = {
    "finals": "the runs' final.json files",
    "histories": "the runs' history.csv files",
    "predictions": "the runs' predictions.npz files",
    "stores": "one canonical store folder per task",
}


def _fill(text: str, width: int) -> str:
    """Paragraphs wrapped to the terminal, as argparse wraps (its raw formatter keeps the steps' columns)."""
    return "\n\n".join(textwrap.fill(part, max(width, 40)) for part in text.split("\n\n"))


def _steps_text(steps: list[tuple[str, str]], width: int) -> str:
    """The pipeline's steps as a second list, laid out like argparse's list of commands."""
    column = max(len(name) for name, _ in steps) + 4
    lines = ["pipeline steps (Snakemake runs them; fedmedbench STEP --help: its options):"]
    for name, text in steps:
        lines += textwrap.wrap(
            text,
            max(width, column + 30),
            initial_indent=f"  {name:<{column - 2}}",
            subsequent_indent=" " * column,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """The top-level parser. An option no command knows is reported by the command's own parser (its
    usage, not the top level's) with the closest option it has; argparse alone names neither."""

    commands: dict[str, argparse.ArgumentParser] = {}

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None), self)
            options = [option for action in command._actions for option in action.option_strings]
            unknown = next((extra.split("=", 1)[0] for extra in extras if extra.startswith("-")), None)
            command.error(f"unrecognized arguments: {' '.join(extras)}{closest(unknown, options) if unknown else ''}")
        return parsed


class VersionAction(argparse.Action):
    """--version: the version and git commit, computed only when asked (a git call)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def add_config_option(parser: argparse.ArgumentParser, help_text: str, required_default: bool = True, **kwargs) -> None:
    """--configfile FILE... (Snakemake's name for the same files), also spelt --config as before."""
    default = [str(DEFAULT_CONFIG)] if required_default else kwargs.pop("default", None)
    suffix = f" (default: {DEFAULT_CONFIG})" if required_default else ""
    parser.add_argument(
        "--configfile", "--config", dest="config", metavar="FILE", default=default, help=help_text + suffix, **kwargs
    )


def build_parser() -> argparse.ArgumentParser:
    width = shutil.get_terminal_size().columns - 2  # as argparse wraps its own text
    parser = Parser(
        prog="fedmedbench", description=_fill(DESCRIPTION, width), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log debug messages too, and show the traceback of an error"
    )
    parser.add_argument(
        "--version", action=VersionAction, help="print the version and the git commit of the code, and exit"
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        title="commands",
        metavar="COMMAND",
        help="one of the commands below (fedmedbench COMMAND --help: its options)",
    )
    steps: list[tuple[str, str]] = []

    def command(name: str, text: str) -> argparse.ArgumentParser:
        """A command a person types: listed under "commands"."""
        return sub.add_parser(name, help=text, description=text)

    def step(name: str, text: str) -> argparse.ArgumentParser:
        """A pipeline step (Snakemake runs it; a job's log shows the command): listed apart, after the
        commands, and left out of argparse's own list (a parser added without help= is not listed)."""
        steps.append((name, text))
        parser = sub.add_parser(name, description=text)
        parser.set_defaults(job=True)  # its log starts with the version line (main)
        return parser

    p = command(
        "check-data",
        "what the pipeline will understand of your own data (family folders), per site: images per split, sizes, "
        "channels, mask values and their classes' pixel shares (or images per class), groups; then each problem "
        "in one line (exit 1 if any)",
    )
    add_config_option(p, "config/config.yaml [overlay.yaml ...]", nargs="+")
    p.add_argument("--dataset", help="only this data section (default: every one; built-in families get one line)")
    p.set_defaults(func=cmd_check_data)

    p = command("methods", "list every method (built in and plug-ins), its origin and parameters")
    add_config_option(
        p,
        "config/config.yaml [overlay.yaml ...]: also list the plug-ins its methods name with module:",
        required_default=False,
        nargs="*",
        default=[],
    )
    p.set_defaults(func=cmd_methods)

    p = command("new-method", "write a pip-installable package with a method of your own (and its test)")
    p.add_argument("name", help="the method's name (lowercase, e.g. fedxyz)")
    p.add_argument("--out", help="the package folder to create (default: ./NAME)")
    p.set_defaults(func=cmd_new_method)

    p = command(
        "estimate",
        "time a few rounds per kind of job and project the cost of the experiments (jobs, GPU-hours, wall-hours)",
    )
    add_config_option(p, "config/config.yaml [overlay.yaml ...]", nargs="+")
    p.add_argument(
        "--experiments",
        nargs="+",
        help="the experiments to project (default: the config's selected_experiments, else all)",
    )
    p.add_argument(
        "--rounds-to-time",
        type=int,
        default=2,
        help="k: each kind of job is timed for 1 and k rounds (default: %(default)s)",
    )
    p.add_argument("--gpus", type=int, default=1, help="GPUs the real run will have (default: %(default)s)")
    p.add_argument(
        "--jobs-per-gpu", type=int, default=1, help="training jobs that share one GPU at a time (default: %(default)s)"
    )
    p.add_argument(
        "--sharing-gain",
        type=float,
        default=1.0,
        help="throughput of jobs-per-gpu concurrent jobs / one job (default: %(default)s)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="the device to time on: auto (a free GPU slot, else the CPU), cpu, or a torch device such as cuda:1",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads of the timed jobs (default: torch's own choice)"
    )
    p.add_argument(
        "--data-workers",
        type=int,
        default=0,
        help="reader threads of the timed jobs (as train --data-workers; default: %(default)s)",
    )
    p.set_defaults(func=cmd_estimate)

    p = command("train", "run one federated training job (what each of the pipeline's training jobs runs)")
    p.add_argument("--run-config", help="the resolved run config as JSON (what Snakemake passes)")
    add_config_option(
        p, "config/config.yaml [overlay.yaml ...] (instead of --run-config)", required_default=False, nargs="+"
    )
    p.add_argument("--task", help="the task, a key of the config's tasks (with --config)")
    p.add_argument("--run", help="method or method-variant, e.g. fedprox or fedavg-e2")
    p.add_argument("--seed", type=int, help="the seed (with --config)")
    p.add_argument("--out", required=True, help="run folder: history.csv, final.json, model_best.pt")
    p.add_argument(
        "--device", default="auto", help="auto (a free GPU slot, else the CPU), cpu, or a torch device such as cuda:1"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of torch (default: torch's own choice; Snakemake passes the rule's threads)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines in the log")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="checkpoint every N rounds (default: the task's checkpoint_every, else 1)",
    )
    p.add_argument(
        "--checkpoint-every-seconds",
        type=float,
        default=0,
        help="and only once this many seconds have passed since the last checkpoint (default 0: every N rounds); the last round always; changes no number",
    )
    p.add_argument(
        "--data-workers",
        type=int,
        default=0,
        help="threads that read the next batches while the device computes (default 0: the training thread reads them; a GPU job: see docs/cost.md); changes no number",
    )
    p.add_argument("--hook-timeout-s", type=float, default=None, metavar="SECONDS",
                   help="end a method hook (e.g. a plug-in's Client.train) that has not returned after this many seconds, with a line naming it "
                        "(default: the task's hook_timeout_s, else no limit; 0: no limit); changes no number")  # fmt: skip
    p.set_defaults(func=cmd_train, job=True)

    p = command(
        "with-jobserver",
        "run a command (e.g. snakemake) whose fedmedbench steps start warm (forked from a process with torch imported)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    p.set_defaults(func=cmd_with_jobserver)

    add_federation_command(sub)  # `federation local`: docs/federation.md

    p = step("fetch", "download (or copy) a raw file, verify it, move it into place")
    p.add_argument("--dataset", required=True, help="the family whose file this is (for its manual-download advice)")
    p.add_argument("--source", required=True, help="http(s)://, file://, gdrive:<id>, a local path, or 'manual'")
    p.add_argument("--dest", required=True, help="where the verified file goes")
    p.add_argument("--sha256", default=None, help="the file's expected SHA-256 (default: not checked)")
    p.add_argument(
        "--source-stamp", default=None, help="a local source's path, size and mtime as the workflow saw them (checked)"
    )
    p.set_defaults(func=cmd_fetch)

    p = step("extract", "safely extract a zip/tar archive")
    p.add_argument("--archive", required=True, help="the zip or tar archive")
    p.add_argument("--out", required=True, help="the folder to extract into")
    p.set_defaults(func=cmd_extract)

    p = step("synthesize", "write the synthetic twin of a family's raw files")
    p.add_argument("dataset", help="the dataset family, e.g. prostate")
    p.add_argument("--out", required=True, help="folder for the raw files")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: %(default)s)")
    p.add_argument("--options", default="{}", help="family-specific sizes as JSON")
    p.set_defaults(func=cmd_synthesize)

    p = step("preprocess", "raw files -> canonical store")
    p.add_argument("dataset", help="the dataset family, e.g. prostate (folders: your own data)")
    p.add_argument("--protocol", required=True, help="the data protocol, a key of the data section's protocols")
    p.add_argument(
        "--raw", nargs="*", default=[], metavar="FILENAME=PATH", help="each raw file and its extracted folder / path"
    )
    p.add_argument("--options", default=None, help="a user's own data (family folders): its data section as JSON")
    p.add_argument("--out", required=True, help="store folder")
    p.add_argument("--counts", help="write per-client sample counts here (JSON)")
    p.add_argument("--size", type=int, default=None, help="image size in pixels")
    p.add_argument(
        "--expect-real-counts", action="store_true", help="fail unless the counts of the real release come out"
    )
    p.set_defaults(func=cmd_preprocess)

    p = step("split", "write the split of record (CSV)")
    p.add_argument("dataset", help="the dataset family, e.g. prostate (folders: your own data)")
    p.add_argument("--protocol", required=True, help="the data protocol, a key of the data section's protocols")
    p.add_argument("--store", required=True, help="the canonical store folder (preprocess --out)")
    p.add_argument("--out", required=True, help="the split CSV to write")
    p.add_argument(
        "--permutation", default="default", help="family-specific: e.g. harmofl (the paper's files) or seeded"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of a seeded permutation (default: %(default)s)")
    p.add_argument("--options", default=None, help="a user's own data (family folders): its data section as JSON")
    p.add_argument(
        "--split-csv-digest", default=None, help="the split_csv's content digest as the workflow saw it (checked)"
    )
    p.set_defaults(func=cmd_split)

    p = step("collect", "per-client metrics of many runs -> one long CSV")
    p.add_argument("--out", required=True, help="the CSV to write")
    p.add_argument("finals", nargs="+", help="the runs' final.json files")
    p.set_defaults(func=cmd_collect)

    # Tables and figures of one experiment: its config section as JSON, an output prefix, its inputs.
    for name, help_text, func, inputs in (
        ("table", "a paper-layout table (csv, md, tex) from runs' final.json", cmd_table, "finals"),
        ("figure", "convergence figure (png, pdf) from runs' history.csv", cmd_figure, "histories"),
        ("sweep-figure", "a hyperparameter sweep figure (png, pdf) from runs' final.json", cmd_sweep_figure, "finals"),
        (
            "qualitative-figure",
            "segmentations of every method (png, pdf) from runs' predictions.npz",
            cmd_qualitative_figure,
            "predictions",
        ),
        (
            "ampnorm-figure",
            "images before/after amplitude normalization (png, pdf); one store per task",
            cmd_ampnorm_figure,
            "stores",
        ),
        (
            "layer-cka-figure",
            "Fed-LWR Fig. 1(b): layer-wise CKA between pairs of local models, and to the FedAvg anchor (png, pdf) from a run's history.csv",
            cmd_layer_cka_figure,
            "histories",
        ),
        (
            "fairness-curves",
            "Avg and Std across clients of the test metric vs round (png, pdf) from history.csv",
            cmd_fairness_curves,
            "histories",
        ),
        (
            "fairness-bars",
            "per-client test metric of every method as bars (png, pdf) from final.json",
            cmd_fairness_bars,
            "finals",
        ),
        (
            "ood-table",
            "PRR-FL Table 3: an OOD cohort's F1/AUC per method (csv, md, tex + --figure-prefix png, pdf) from final.json",
            cmd_ood_table,
            "finals",
        ),
        (
            "retrogress-figure",
            "PRR-FL Fig. 1: one client's test metric along local epochs (png, pdf) from history.csv",
            cmd_retrogress_figure,
            "histories",
        ),
    ):
        p = step(name, help_text)
        p.add_argument("--experiment", required=True, help="the experiment's config section as JSON")
        p.add_argument(
            "--out-prefix", required=True, help="the outputs' path without its suffix (each format adds its own)"
        )
        p.add_argument(inputs, nargs="+", help=INPUT_HELP[inputs])
        if name == "ood-table":
            p.add_argument("--figure-prefix", required=True, help="the bar figure's path without its suffix (png, pdf)")
        p.set_defaults(func=func)

    p = step("report", "our numbers next to the published ones (Markdown)")
    p.add_argument("--experiments", required=True, help="the experiments config section as JSON")
    p.add_argument("--paper-tables", required=True, help="folder of the papers' tables (CSV)")
    p.add_argument("--out", required=True, help="the Markdown report to write")
    p.add_argument("finals", nargs="+", help="the runs' final.json files")
    p.set_defaults(func=cmd_report)

    parser.epilog = _steps_text(steps, width)
    parser.commands = dict(sub.choices)
    return parser


def _stderr_is_a_file() -> bool:
    """A job's log: Snakemake's rules send a step's output to its log file (`&> {log}`), and the job
    server hands the job that same file. A terminal or a pipe (a person, a test) gets no header line,
    so that bad input there stays one line."""
    try:
        return stat.S_ISREG(os.fstat(sys.stderr.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):  # no real stderr (e.g. replaced by a StringIO)
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command != "with-jobserver":
        from fedmedbench.jobserver import run_remotely

        code = run_remotely(argv)  # a warm job server, when one runs (make demo): every step starts warm
        if code is not None:
            return code
    _setup_logging(args.verbose)
    if getattr(args, "job", False) and _stderr_is_a_file():
        logging.getLogger("fedmedbench").info(version_line())
    try:
        if getattr(args, "config", None):
            config_files(args.config)
        args.func(args)
    except HookStopped as stop:
        # SIGTERM, Ctrl-C or hook_timeout_s while a method hook ran: one line naming it.
        if args.verbose:
            raise
        logging.getLogger("fedmedbench").error("%s", stop)
        return stop.code
    except (FedmedbenchError, ValueError, OSError) as err:
        # Bad input (config, data, archive, checkpoint) or a diverged run: one line naming the file,
        # key or round, and a non-zero exit. -v shows the traceback too.
        if args.verbose:
            raise
        logging.getLogger("fedmedbench").error("%s: %s", type(err).__name__, str(err).replace("\n", " "))
        return 1
    return 0
