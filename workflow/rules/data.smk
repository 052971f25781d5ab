# download -> verify -> extract -> preprocess -> split


rule synthesize_prostate:
    output:
        f"{ROOT}/data/prostate/synthetic/Processed_data_nii.zip",
    log:
        f"{ROOT}/logs/data/synthesize_prostate.log",
    conda:
        "../../envs/data.yaml"
    params:
        seed=synthetic_options("prostate").get("seed", 0),
        cases=synthetic_options("prostate").get("cases_per_site", 3),
        depth=synthetic_options("prostate").get("depth", 10),
        size=synthetic_options("prostate").get("size", 64),
    shell:
        "python -m fedmedbench synthesize prostate --out {output} --seed {params.seed} "
        "--cases-per-site {params.cases} --depth {params.depth} --size {params.size} &> {log}"


rule download:
    input:
        unpack(download_inputs),
    output:
        archive=f"{ROOT}/data/{{dataset}}/raw/{{archive}}",
        checksum=f"{ROOT}/data/{{dataset}}/raw/{{archive}}.sha256",
    log:
        f"{ROOT}/logs/data/download_{{dataset}}_{{archive}}.log",
    conda:
        "../../envs/data.yaml"
    params:
        source=download_source,
        sha256=sha256_option,
    shell:
        "python -m fedmedbench fetch --dataset {wildcards.dataset} --source {params.source:q} "
        "--dest {output.archive} {params.sha256} &> {log}"


rule extract:
    input:
        f"{ROOT}/data/{{dataset}}/raw/{{archive}}",
    output:
        directory(f"{ROOT}/data/{{dataset}}/extracted/{{archive}}"),
    log:
        f"{ROOT}/logs/data/extract_{{dataset}}_{{archive}}.log",
    conda:
        "../../envs/data.yaml"
    shell:
        "python -m fedmedbench extract --archive {input} --out {output} &> {log}"


rule preprocess_prostate:
    input:
        f"{ROOT}/data/prostate/extracted/Processed_data_nii.zip",
    output:
        store=directory(f"{ROOT}/data/{{dataset}}/{{protocol}}/store"),
        counts=f"{ROOT}/data/{{dataset}}/{{protocol}}/counts.json",
    log:
        f"{ROOT}/logs/data/preprocess_{{dataset}}_{{protocol}}.log",
    wildcard_constraints:
        dataset="prostate",
        protocol="harmofl",
    conda:
        "../../envs/data.yaml"
    params:
        options=preprocess_options,
    shell:
        "python -m fedmedbench preprocess prostate --raw {input} --out {output.store} "
        "--counts {output.counts} {params.options} &> {log}"


rule split_prostate:
    input:
        f"{ROOT}/data/{{dataset}}/{{protocol}}/store",
    output:
        f"{ROOT}/data/{{dataset}}/{{protocol}}/split.csv",
    log:
        f"{ROOT}/logs/data/split_{{dataset}}_{{protocol}}.log",
    wildcard_constraints:
        dataset="prostate",
        protocol="harmofl",
    conda:
        "../../envs/data.yaml"
    params:
        options=split_options,
    shell:
        "python -m fedmedbench split prostate --store {input} --out {output} {params.options} &> {log}"
