#!/usr/bin/env bash
# What to measure when a GPU is at hand for a few minutes (a dated file under benchmarks/results/ records the results,
# naming the device). Each step has its own time limit and writes its output as it goes, so a step cut
# short still leaves what it measured, and the next step runs:
#   1. the device and the software;
#   2. benchmarks/bench_engine.py at the papers' shapes: plain loop vs engine, fp32/bf16, 1/2/4 jobs;
#   3. checkpoints of a state in GPU memory (benchmarks/bench_checkpoint.py --device cuda): bytes and write time;
#   4. where a prostate FedAvg round goes on the device (benchmarks/bench_round.py, 3 rounds, test every
#      10th round as the 500-round job does) on a store of the paper's shapes and counts;
#   5. `fedmedbench estimate` on such stores (benchmarks/paper_shaped_stores.py), one experiment at a
#      time, as long as the time lasts (all in estimate.md).
#
#   bash benchmarks/gpu_session.sh                 # results in results/gpu-session/
#   OUT=/somewhere BUDGET=900 bash benchmarks/gpu_session.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu-session}
BUDGET=${BUDGET:-520}   # seconds for the whole script
PY=${PY:-python3}
STORES=${STORES:-/tmp/fedmedbench-paper-shaped}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
left() { echo $((BUDGET - SECONDS)); }
step() {  # step FILE LIMIT COMMAND...: run with the smaller of LIMIT and the time left, output appended to $OUT/FILE
    local name=$1 limit=$2; shift 2
    local t; t=$(left); ((t < limit)) && limit=$t
    if ((limit < 20)); then echo "skipped: $* ($(left) s left)" | tee -a "$OUT/steps.txt"; return; fi
    local start=$SECONDS rc
    echo "\$ $*" >>"$OUT/$name"
    timeout -k 10 "$limit" "$@" >>"$OUT/$name" 2>&1
    rc=$?
    echo "exit $rc after $((SECONDS - start)) s (limit $limit s): $*" | tee -a "$OUT/steps.txt"
}

{ nvidia-smi; $PY -c "import torch, sys; print(sys.version); print('torch', torch.__version__, torch.cuda.get_device_name())"; nproc; free -g; } >"$OUT/device.txt" 2>&1
step bench_engine.md 230 $PY benchmarks/bench_engine.py --json "$OUT/bench_engine.json"
step checkpoint_gpu.md 45 $PY benchmarks/bench_checkpoint.py --device cuda --tasks camelyon17 prostate --reps 3
step stores.txt 60 $PY benchmarks/paper_shaped_stores.py --out "$STORES/paper-shaped" --tasks prostate prostate_lwr nuclei skin
step bench_round.md 90 $PY benchmarks/bench_round.py --config config/config.yaml "$STORES/paper-shaped/overlay.yaml" \
    --task prostate --run fedavg --rounds 3 --curve-every 10 --device cuda --json "$OUT/bench_round.json"
for experiment in harmofl_table6_ablation_prostate fedlwr_fig2_convergence harmofl_table5_ablation_nuclei prrfl_fig1_retrogress; do
    step estimate.md 150 $PY -m fedmedbench estimate --config config/config.yaml "$STORES/paper-shaped/overlay.yaml" \
        --experiments "$experiment" --device cuda
done
echo "done in $SECONDS s" | tee -a "$OUT/steps.txt"
