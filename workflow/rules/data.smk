# synthesize (demo) | download -> verify -> extract -> preprocess -> split. One set of rules for
# every dataset family: each family package declares its raw files (fedmedbench.data).


rule synthesize:
    output:
        directory(f"{ROOT}/data/{{dataset}}/synthetic"),
    log:
        f"{ROOT}/logs/data/synthesize_{{dataset}}.log",
    conda:
        "../envs/data.yaml"
    params:
        family=family_name,
        options=synthetic_options,
        seed=synthetic_seed,
    shell:
        "python -m fedmedbench synthesize {params.family} --out {output:q} --seed {params.seed} "
        "--options {params.options:q} &> {log:q}"


rule download:
    input:
        unpack(download_inputs),
    output:
        file=f"{ROOT}/data/{{dataset}}/raw/{{file}}",
        checksum=f"{ROOT}/data/{{dataset}}/raw/{{file}}.sha256",
    log:
        f"{ROOT}/logs/data/download_{{dataset}}_{{file}}.log",
    conda:
        "../envs/data.yaml"
    params:
        source=download_source,
        # --sha256, and the stamp of a file downloaded by hand (its replacement re-runs this job).
        # The name stays `sha256`: renaming it would change the shell command, re-running every download.
        sha256=fetch_options,
    shell:
        "python -m fedmedbench fetch --dataset {wildcards.dataset} --source {params.source:q} "
        "--dest {output.file:q} {params.sha256} &> {log:q}"


rule extract:
    input:
        f"{ROOT}/data/{{dataset}}/raw/{{archive}}",
    output:
        directory(f"{ROOT}/data/{{dataset}}/extracted/{{archive}}"),
    log:
        f"{ROOT}/logs/data/extract_{{dataset}}_{{archive}}.log",
    conda:
        "../envs/data.yaml"
    shell:
        "python -m fedmedbench extract --archive {input:q} --out {output:q} &> {log:q}"


rule preprocess:
    input:
        unpack(preprocess_inputs),
    output:
        store=directory(f"{ROOT}/data/{{dataset}}/{{protocol}}/store"),
        counts=f"{ROOT}/data/{{dataset}}/{{protocol}}/counts.json",
    log:
        f"{ROOT}/logs/data/preprocess_{{dataset}}_{{protocol}}.log",
    conda:
        "../envs/data.yaml"
    params:
        family=family_name,
        raw=raw_arguments,
        options=preprocess_options,
        listing=user_data_listing,  # a user's own data: its files' names, sizes and times
    shell:
        "python -m fedmedbench preprocess {params.family} --protocol {wildcards.protocol} "
        "--raw {params.raw} --out {output.store:q} --counts {output.counts:q} {params.options} &> {log:q}"


rule split:
    input:
        f"{ROOT}/data/{{dataset}}/{{protocol}}/store",
    output:
        f"{ROOT}/data/{{dataset}}/{{protocol}}/split.csv",
    log:
        f"{ROOT}/logs/data/split_{{dataset}}_{{protocol}}.log",
    conda:
        "../envs/data.yaml"
    params:
        family=family_name,
        options=split_options,
    shell:
        "python -m fedmedbench split {params.family} --protocol {wildcards.protocol} "
        "--store {input:q} --out {output:q} {params.options} &> {log:q}"
