#!/usr/bin/env bash
# The tiny synthetic pipeline submitted through workflow/profiles/slurm to a real single-node SLURM
# (started by cluster.sh; training jobs get one (fake) GPU each). About 5 minutes. `make test-slurm`.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap '"$repo/tests/slurm/cluster.sh" stop; rm -rf "$work"' EXIT
"$repo/tests/slurm/cluster.sh" start
cp "$repo/config.yaml" "$work/"
REPO="$repo" python - "$work/tiny.yaml" <<'PY'
import os, sys, yaml
sys.path.insert(0, os.environ["REPO"])
from tests.test_workflow import TINY
yaml.safe_dump({**TINY, "run_name": "slurm"}, open(sys.argv[1], "w"))
PY
cd "$work"
# No slurmdbd here: poll with squeue (MinJobAge=300 keeps finished jobs visible), and ask for small jobs.
snakemake -s "$repo/Snakefile" --workflow-profile "$repo/workflow/profiles/slurm" \
  --configfile "$repo/config.yaml" tiny.yaml --jobs 4 \
  --slurm-status-command squeue --slurm-init-seconds-before-status-checks 2 \
  --default-resources slurm_account=root mem_mb=1000 runtime=10 \
  --set-resources train:mem_mb=2000 train:cpus_per_task=1 --set-threads train=1
test -s results/slurm/report.md && test -s results/slurm/tables/harmofl_table1_prostate.md
grep -q "gpu:1" <(scontrol show jobs) && echo "training jobs were submitted with a GPU request"
echo "SLURM profile: OK"
