# Paper-layout tables, figures, and the reproduced-vs-published report.
# light: no torch
from fedmedbench.report.metric_names import SWEEP_ERRORS, metric_label


rule table:
    input:
        experiment_finals,
    output:
        csv=report(
            f"{ROOT}/tables/{{experiment}}.csv",
            caption="../report/table.rst",
            category="Tables",
        ),
        md=f"{ROOT}/tables/{{experiment}}.md",
        tex=f"{ROOT}/tables/{{experiment}}.tex",
    log:
        f"{ROOT}/logs/report/table_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("table")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/tables/{{experiment}}",
        # the metric in words, for the caption in `snakemake --report` (../report/table.rst)
        metric=lambda w: metric_label(config["experiments"][w.experiment]["metric"]),
    shell:
        "python -m fedmedbench table --experiment {params.experiment:q} --out-prefix {params.prefix:q} "
        "{input:q} &> {log:q}"


rule convergence_figure:
    input:
        histories=experiment_histories,
        finals=experiment_finals,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}_convergence.png",
            caption="../report/convergence.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}_convergence.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}_convergence.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("table")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}_convergence",
    shell:
        "python -m fedmedbench figure --experiment {params.experiment:q} --out-prefix {params.prefix:q} "
        "{input.histories:q} &> {log:q}"


rule reproduction_report:
    input:
        finals=all_finals,
        figures=all_figures,
        paper_tables=f"{RESOURCES}/paper_tables",
    output:
        report(f"{ROOT}/report.md", caption="../report/report.rst", category="Report"),
    log:
        f"{ROOT}/logs/report/report.log",
    conda:
        "../envs/report.yaml"
    params:
        experiments=experiments_json,
        paper_table_digest=paper_tables_digest,  # their content: an edited table re-runs the report
    shell:
        "python -m fedmedbench report --experiments {params.experiments:q} --paper-tables {input.paper_tables:q} "
        "--out {output:q} {input.finals:q} &> {log:q}"


rule sweep_figure:
    input:
        experiment_finals,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/sweep.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("sweep")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
        # the error bars in words, for the caption (../report/sweep.rst)
        error=lambda w: SWEEP_ERRORS[fmb.experiment(config, w.experiment).error],
    shell:
        "python -m fedmedbench sweep-figure --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input:q} &> {log:q}"


rule qualitative_figure:
    input:
        experiment_predictions,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/qualitative.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("qualitative")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench qualitative-figure --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input:q} &> {log:q}"


rule ampnorm_figure:
    input:
        stores=experiment_stores,
        splits=experiment_splits,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/ampnorm.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("ampnorm")),
    conda:
        "../envs/torch.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench ampnorm-figure --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input.stores:q} &> {log:q}"


rule layer_cka_figure:
    input:
        experiment_histories,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/layer_cka.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("layer_cka")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench layer-cka-figure --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input:q} &> {log:q}"


rule fairness_curves_figure:
    input:
        histories=experiment_histories,
        finals=experiment_finals,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/fairness_curves.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("fairness_curves")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench fairness-curves --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input.histories:q} &> {log:q}"


rule fairness_bars_figure:
    input:
        experiment_finals,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/fairness_bars.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("fairness_bars")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench fairness-bars --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input:q} &> {log:q}"


rule ood_table:
    input:
        experiment_finals,
    output:
        csv=report(
            f"{ROOT}/tables/{{experiment}}.csv",
            caption="../report/table.rst",
            category="Tables",
        ),
        md=f"{ROOT}/tables/{{experiment}}.md",
        tex=f"{ROOT}/tables/{{experiment}}.tex",
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/ood_table.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        figure_csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/table_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("ood_table")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/tables/{{experiment}}",
        figure_prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench ood-table --experiment {params.experiment:q} --out-prefix {params.prefix:q} "
        "--figure-prefix {params.figure_prefix:q} {input:q} &> {log:q}"


rule retrogress_figure:
    input:
        experiment_histories,
    output:
        png=report(
            f"{ROOT}/figures/{{experiment}}.png",
            caption="../report/retrogress.rst",
            category="Figures",
        ),
        pdf=f"{ROOT}/figures/{{experiment}}.pdf",
        csv=report(
            f"{ROOT}/figures/{{experiment}}.csv",
            caption="../report/figure_data.rst",
            category="Figure source data",
        ),
    log:
        f"{ROOT}/logs/report/figure_{{experiment}}.log",
    wildcard_constraints:
        experiment=name_pattern(experiments_of("retrogress")),
    conda:
        "../envs/report.yaml"
    params:
        experiment=experiment_json,
        synthetic=experiment_synthetic,  # the caption says so (../report/*.rst)
        prefix=f"{ROOT}/figures/{{experiment}}",
    shell:
        "python -m fedmedbench retrogress-figure --experiment {params.experiment:q} "
        "--out-prefix {params.prefix:q} {input:q} &> {log:q}"
