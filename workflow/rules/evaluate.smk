# Test-set metrics of every run of an experiment, gathered into one long CSV. (The test split is
# evaluated inside the training job at every round, for the curves; the reported value is the one
# at the round selected on the validation split.)


rule collect_metrics:
    input:
        experiment_finals,
    output:
        f"{ROOT}/eval/{{experiment}}/metrics.csv",
    log:
        f"{ROOT}/logs/eval/{{experiment}}.log",
    conda:
        "../envs/report.yaml"
    shell:
        "python -m fedmedbench collect --out {output:q} {input:q} &> {log:q}"
