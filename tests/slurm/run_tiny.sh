#!/usr/bin/env bash
# The tiny synthetic pipeline submitted through workflow/profiles/slurm to a real single-node SLURM
# with accounting (started by cluster.sh; training jobs get one fake GPU each). The executor plugin
# polls job states with its default, sacct. A few minutes. `make test-slurm`; CI runs it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
cleanup() {
  status=$?
  if [ $status -ne 0 ]; then
    echo "--- test-slurm failed; last Snakemake log lines and SLURM logs ---" >&2
    tail -n 60 "$work"/.snakemake/log/*.log 2>/dev/null >&2 || true
    tail -n 30 /tmp/fedmedbench-slurm/log/*.log 2>/dev/null >&2 || true
    find "$work/results/slurm/logs" -name "*.log" -exec tail -n 20 {} + 2>/dev/null >&2 || true
  fi
  "$repo/tests/slurm/cluster.sh" stop
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
"$repo/tests/slurm/cluster.sh" start
cp "$repo/config.yaml" "$work/"
# The same tiny overlay as the end-to-end test (tests/test_workflow.py), on the same demo overlay
# (synthetic data), one seed: the two tests cannot drift apart again.
REPO="$repo" python - "$work/tiny.yaml" <<'PY'
import os, sys, yaml
sys.path.insert(0, os.environ["REPO"])
from tests.test_workflow import TINY
tiny = {**TINY, "run_name": "slurm"}
tiny["experiments"] = {"harmofl_table1_prostate": {**TINY["experiments"]["harmofl_table1_prostate"], "seeds": [0]}}
yaml.safe_dump(tiny, open(sys.argv[1], "w"))
PY
cd "$work"
started=$(date +%H:%M:%S)
snakemake results/slurm/report.md results/slurm/tables/harmofl_table1_prostate.md \
  -s "$repo/Snakefile" --workflow-profile "$repo/workflow/profiles/slurm" \
  --configfile "$repo/config.yaml" "$repo/workflow/profiles/demo/demo.yaml" tiny.yaml --jobs 4 \
  --slurm-init-seconds-before-status-checks 2 \
  --default-resources slurm_account=root mem_mb=1000 runtime=10 \
  --set-resources train:mem_mb=2000 train:cpus_per_task=1 --set-threads train=1
test -s results/slurm/report.md && test -s results/slurm/tables/harmofl_table1_prostate.md
grep -q FedProx results/slurm/tables/harmofl_table1_prostate.md

# Accounting saw every job finish, and the training jobs held a GPU.
sacct -n -X -S "$started" -o JobID,State%20,AllocTRES%80 > sacct.txt
cat sacct.txt
jobs=$(wc -l < sacct.txt)
completed=$(grep -c " COMPLETED " sacct.txt || true)
gpu_jobs=$(grep -c "gres/gpu=1" sacct.txt || true)
[ "$jobs" -gt 0 ] && [ "$completed" -eq "$jobs" ] || { echo "sacct: $completed of $jobs jobs COMPLETED" >&2; exit 1; }
[ "$gpu_jobs" -eq 3 ] || { echo "sacct: expected 3 training jobs with gres/gpu=1, saw $gpu_jobs" >&2; exit 1; }
echo "SLURM profile: OK ($jobs jobs COMPLETED in accounting, $gpu_jobs with a GPU)"
