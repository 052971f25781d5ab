# One job per (task, run, seed). `run` is a method or method-variant (e.g. fedprox-mu0.1).
# params.run_config is the fully resolved run config, so changing a setting re-runs exactly the
# jobs it affects. A killed job resumes from checkpoint.pt (not a declared output, so Snakemake
# leaves it in place) and ends with the same numbers.


rule train:
    input:
        unpack(train_inputs),
    output:
        final=f"{ROOT}/train/{{task}}/{{run}}/seed{{seed}}/final.json",
        history=f"{ROOT}/train/{{task}}/{{run}}/seed{{seed}}/history.csv",
        model=f"{ROOT}/train/{{task}}/{{run}}/seed{{seed}}/model_best.pt",
        predictions=f"{ROOT}/train/{{task}}/{{run}}/seed{{seed}}/predictions.npz",
    log:
        f"{ROOT}/logs/train/{{task}}/{{run}}/seed{{seed}}.log",
    benchmark:
        f"{ROOT}/benchmarks/train/{{task}}/{{run}}/seed{{seed}}.tsv"
    conda:
        "../envs/torch.yaml"
    threads: 1
    # checkpoint_every and data_workers are resources, not params: they cannot change any number, so
    # changing them must neither re-run finished jobs nor discard a killed job's checkpoint.
    # data_workers (threads reading the next batches; 0 = the training thread reads them): set it for
    # GPU jobs in a profile (`set-resources: train: data_workers: 3`), see docs/cost.md.
    resources:
        gpu=1,
        checkpoint_every=checkpoint_every,
        # at most one checkpoint per this many seconds (0: every checkpoint_every rounds), e.g.
        # `--set-resources train:checkpoint_every_seconds=600` for fast GPU jobs (docs/cost.md)
        checkpoint_every_seconds=0,
        data_workers=0,
        # a method hook that has not returned after this many seconds is ended with a line naming
        # it (tasks.<task>.hook_timeout_s; "0": no limit); changes no number
        hook_timeout_s=hook_timeout,
    params:
        run_config=run_config_json,
        out_dir=run_dir,
    shell:
        "python -m fedmedbench train --run-config {params.run_config:q} --out {params.out_dir:q} "
        "--threads {threads} --checkpoint-every {resources.checkpoint_every} --checkpoint-every-seconds {resources.checkpoint_every_seconds} "
        "--data-workers {resources.data_workers} --hook-timeout-s {resources.hook_timeout_s} &> {log:q}"
