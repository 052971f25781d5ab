# fedmedbench: raw data -> client shards -> one training job per (task, run, seed) -> tables,
# figures and a report of our numbers next to the papers'. See README.md.
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        all_targets(),
