#!/usr/bin/env bash
# The tiny synthetic pipeline submitted through workflow/profiles/slurm to a real single-node SLURM
# with accounting (started by cluster.sh). Config: the end-to-end test's layers (tests/tiny.py:
# config/config.yaml, the demo overlay, tests/tiny.yaml), then tests/slurm/slurm.yaml (two training jobs).
# The executor plugin polls job states with its default, sacct (no --slurm-status-command).
# Asserts: the run completed and made its outputs; every job Snakemake submitted is COMPLETED in
# accounting; the training jobs, and only they, held a GPU (`resources: gpu=1` -> sbatch --gpus=1).
# Every daemon is stopped at the end, also on failure; on failure the logs are printed.
# 3-5 minutes on 2 cores with the packages installed, +40 s to install them. `make test-slurm`; CI runs it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "$repo/.venv/bin/snakemake" ] && export PATH="$repo/.venv/bin:$PATH"
export SLURM_SCRATCH=${SLURM_SCRATCH:-/tmp/fedmedbench-slurm}
TIMEOUT=${TEST_SLURM_TIMEOUT:-600}   # the Snakemake run; a hang (e.g. a status query that never answers) fails
work=$(mktemp -d /tmp/fedmedbench-test-slurm.XXXXXX)

fail() { echo "test-slurm: $*" >&2; exit 1; }

cleanup() {
  local status=$? f
  trap - EXIT
  set +e
  if [ $status -ne 0 ]; then
    {
      echo "=== test-slurm FAILED (exit $status); the logs follow ==="
      for f in "$work"/.snakemake/log/*.snakemake.log; do
        [ -f "$f" ] && { echo "--- Snakemake log $f"; cat "$f"; }
      done
      find "$work/.snakemake/slurm_logs" "$work/results" -name "*.log" -type f 2>/dev/null | sort | while read -r f; do
        echo "--- $f (last 40 lines)"; tail -n 40 "$f"
      done
      for f in "$SLURM_SCRATCH"/log/*.log; do
        [ -f "$f" ] && { echo "--- $f (last 40 lines)"; tail -n 40 "$f"; }
      done
      echo "--- sinfo / squeue / sacct"
      sinfo -N -l; squeue; sacct -X -S "${started:-now}" -o JobID,JobName%36,State,ExitCode,Comment%70
    } >&2
  fi
  "$repo/tests/slurm/cluster.sh" stop || status=1
  if [ $status -eq 0 ]; then rm -rf "$work"; else echo "test-slurm: work folder kept: $work" >&2; fi
  exit $status
}
trap cleanup EXIT

"$repo/tests/slurm/cluster.sh" start
mkdir -p "$work/config" && cp "$repo/config/config.yaml" "$work/config/"   # the Snakefile's default configfile
layers=$(cd "$repo" && python -m tests.tiny)
mapfile -t configs <<< "$layers"
# Record each sbatch and sacct call: the training jobs must be submitted with a GPU, and the executor
# must poll job states with sacct (its default).
mkdir "$work/bin"
for tool in sbatch sacct; do
  printf '#!/bin/sh\necho "$*" >> %s/%s-calls.txt\nexec %s "$@"\n' "$work" $tool "$(command -v $tool)" > "$work/bin/$tool"
  chmod +x "$work/bin/$tool"
done
export PATH="$work/bin:$PATH"
cd "$work"
started=$(date +%Y-%m-%dT%H:%M:%S)
timeout -k 60 "$TIMEOUT" snakemake results/slurm/report.md results/slurm/tables/harmofl_table1_prostate.md \
  -s "$repo/workflow/Snakefile" --workflow-profile "$repo/workflow/profiles/slurm" \
  --configfile "${configs[@]}" "$repo/tests/slurm/slurm.yaml" --jobs 4 \
  --slurm-init-seconds-before-status-checks 2 \
  --default-resources slurm_account=root mem_mb=1000 runtime=10 \
  --set-resources train:mem_mb=2000 train:cpus_per_task=1 --set-threads train=1 \
  || fail "the Snakemake run failed (exit $?; 124: it ran past ${TIMEOUT}s)"

# The run completed: its outputs exist.
out=results/slurm
for f in report.md tables/harmofl_table1_prostate.{md,csv,tex} figures/harmofl_table1_prostate_convergence.{png,pdf} \
  train/prostate/{fedavg,fedprox}/seed0/final.json; do
  [ -s "$out/$f" ] || fail "missing output $out/$f"
done
grep -q FedProx $out/tables/harmofl_table1_prostate.md || fail "no FedProx row in the table"
grep -q SYNTHETIC $out/report.md || fail "the report does not say the data are synthetic"

# Submission and accounting: the training jobs (comment rule_train_...), and only they, were submitted
# with --gpus=1 and held one GPU; every job this run submitted (--job-name <run ID>) is COMPLETED.
log=$(ls -t .snakemake/log/*.snakemake.log | head -n 1)
run_id=$(sed -n 's/.*SLURM run ID: \([^ ]*\).*/\1/p' "$log" | head -n 1)
[ -n "$run_id" ] || fail "no SLURM run ID in $log"
submitted=$(grep -c "has been submitted with SLURM jobid" "$log" || true)
polls=$(grep -c -- "--name $run_id" sacct-calls.txt || true)   # before the sacct calls below
train_submits=$(grep -c "rule_train_" sbatch-calls.txt || true)
train_gpu_submits=$(grep "rule_train_" sbatch-calls.txt | grep -c -- "--gpus=1" || true)
other_gpu_submits=$(grep -v "rule_train_" sbatch-calls.txt | grep -c -E -- "--gpus|--gres" || true)
echo "sbatch: $(wc -l < sbatch-calls.txt) calls, $train_submits training jobs, $train_gpu_submits of them with --gpus=1; sacct: $polls status polls"
[ "$train_submits" -eq 2 ] && [ "$train_gpu_submits" -eq 2 ] && [ "$other_gpu_submits" -eq 0 ] \
  || fail "sbatch did not get --gpus=1 for exactly the 2 training jobs"
[ "$polls" -gt 0 ] || fail "the executor never polled job states with sacct"
sacct -X --name "$run_id" -S "$started" -o JobID,State,ExitCode,AllocTRES%50,Comment%70
sacct -n -X -P --name "$run_id" -S "$started" -o JobID,State,AllocTRES,Comment > sacct.txt
awk -F'|' -v submitted="$submitted" '
  { jobs++ }
  $2 == "COMPLETED" { completed++ }
  $4 ~ /^rule_train/ { train++; if ($3 ~ /gres\/gpu=1/) train_gpu++ }
  $4 !~ /^rule_train/ && $3 ~ /gres\/gpu/ { print "job " $1 " (" $4 ") held a GPU" > "/dev/stderr"; bad++ }
  END {
    printf "accounting: %d jobs (Snakemake submitted %d), %d COMPLETED, %d training jobs, %d of them with a GPU\n",
      jobs, submitted, completed, train, train_gpu
    exit !(jobs > 0 && jobs == submitted && completed == jobs && train == 2 && train_gpu == train && !bad)
  }' sacct.txt || fail "accounting does not show every job COMPLETED with a GPU for exactly the 2 training jobs"
echo "SLURM profile: OK"
