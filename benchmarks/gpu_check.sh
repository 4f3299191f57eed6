#!/usr/bin/env bash
# One-shot check on a lent GPU machine (jax preinstalled, no package access).
# Run from the repository root:  bash benchmarks/gpu_check.sh
# Builds nothing; runs the GPU-relevant correctness tests, the engine benchmark and the
# four seed sweeps at 4096 seeds, then prints a short table. Budget: under 8 minutes.
set -uo pipefail
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$OUT/summary.txt"

log "correctness on the device (engine vs reference, batching, measures)"
timeout 240 python3 -m pytest -q -x tests/test_engine_exact.py tests/test_engine_batching.py \
    tests/test_measures.py -k "not jit_matches" 2>&1 | tail -3 | tee -a "$OUT/summary.txt"

log "engine benchmark (all measures, then the minimal core engine)"
timeout 150 python3 -m benchmarks.bench_engine --lanes 1 4096 16384 65536 --repeats 3 2>&1 | tee "$OUT/bench.txt" | tail -8
timeout 90 python3 -m benchmarks.bench_engine --lanes 16384 65536 --repeats 3 --measures minimal --no-reference \
    2>&1 | tee "$OUT/bench_minimal.txt" | tail -4

for sweep in kv_budget schedulers return_after_silence rpm; do
  start=$(date +%s.%N)
  timeout 90 python3 -m sweeps.$sweep --seeds 4096 --out "$OUT/$sweep" --no-plots > "$OUT/$sweep.txt" 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf "sweep %-22s rc=%s wall %.1f s\n" "$sweep" "$rc" "$(echo "$end - $start" | bc)" | tee -a "$OUT/summary.txt"
done
start=$(date +%s.%N)
timeout 60 python3 -m sweeps.kv_budget --seeds 4096 --out "$OUT/kv_budget_warm" --no-plots > /dev/null 2>&1
end=$(date +%s.%N)
printf "sweep kv_budget (warm compilation cache) wall %.1f s\n" "$(echo "$end - $start" | bc)" | tee -a "$OUT/summary.txt"

log "summary"
cat "$OUT/summary.txt"
tail -6 "$OUT/bench.txt"
tail -3 "$OUT/bench_minimal.txt"
