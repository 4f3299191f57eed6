#!/usr/bin/env bash
# One-shot check on a lent GPU machine (jax preinstalled, no package access).
# Run from the repository root:  bash benchmarks/gpu_check.sh
# Builds nothing; runs the device correctness tests, the engine benchmark up to 65536
# lanes and the kv_budget / schedulers sweeps at 4096 seeds (cold and warm compilation
# cache) and the vllm server's benchmark, then prints a short table. Timeouts sum to 465 s (under 8 minutes).
set -uo pipefail
export PYTHONPATH=.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee "$OUT/summary.txt"

log "correctness on the device (engine vs reference, batching)"
timeout 120 python3 -m pytest -q -x tests/test_engine_exact.py tests/test_engine_batching.py \
    -k "not jit_matches" 2>&1 | tail -3 | tee -a "$OUT/summary.txt"

log "engine benchmark (the schedulers sweep's measures), then the core engine"
timeout 120 python3 -m benchmarks.bench_engine --lanes 4096 16384 65536 --repeats 2 --no-reference \
    --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt" | tail -6
timeout 45 python3 -m benchmarks.bench_engine --lanes 16384 65536 --repeats 2 --measures none --no-reference \
    2>&1 | tee "$OUT/bench_core.txt" | tail -4

log "the vllm server on the engine beside ideal, engine alone and end to end"
timeout 30 python3 -m benchmarks.bench_vllm --lanes 4096 65536 --repeats 1 --reference-steps 20 \
    2>&1 | tee "$OUT/bench_vllm.txt" | tail -6

run_sweep() {  # name, timeout, label
  local start end rc
  start=$(date +%s.%N)
  timeout "$2" python3 -m sweeps."$1" --seeds 4096 --out "$OUT/$3" --no-plots > "$OUT/$3.txt" 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf "sweep %-28s rc=%s wall %.1f s\n" "$3" "$rc" "$(echo "$end - $start" | bc)" | tee -a "$OUT/summary.txt"
}
run_sweep kv_budget 60 kv_budget
run_sweep kv_budget 45 kv_budget_warm_cache
run_sweep schedulers 45 schedulers

log "summary"
cat "$OUT/summary.txt"
tail -6 "$OUT/bench.txt"
tail -3 "$OUT/bench_core.txt"
