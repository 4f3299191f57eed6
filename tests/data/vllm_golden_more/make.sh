#!/usr/bin/env bash
# Regenerate every file in this folder:  tests/data/vllm_golden_more/make.sh VENV
# VENV: a virtual environment holding vllm==0.33.0 (python3 -m venv VENV &&
# VENV/bin/pip install vllm), outside the repository; the project never imports vLLM.
# Per case NAME below: NAME.csv (tool.py gen with the first argument group),
# NAME.config.json and NAME.schedule.json (harness.py run with the second group, then
# reduced to the shared goldens' fields), NAME.full.json (the whole harness log, only for
# priority runs where a request preempted itself), and victims.json (every preemption).
# All runs happen in one vLLM process (its import costs more than most runs).
set -euo pipefail
VENV=${1:?usage: make.sh VENV   (a venv with vllm 0.33.0)}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# name | trace (tool.py gen) | server (harness.py; block size 16 unless given, chunked
# prefill on, fcfs, no prefix caching, no long-prefill threshold unless given)
CASES=$(cat <<'END'
m000 | --n 10 --seed 101 --tenants 2 --priorities 0,1 --prompt 32:200 --output 150:300 --mean-gap 3 | --num-blocks 36 --max-num-batched-tokens 512 --max-num-seqs 8 --policy priority
m001 | --n 12 --seed 102 --tenants 3 --priorities 0,1,2 --prompt 32:300 --output 150:300 --mean-gap 3 | --num-blocks 42 --max-num-batched-tokens 256 --max-num-seqs 8 --policy priority
m002 | --n 16 --seed 103 --tenants 3 --priorities 2,1,0 --prompt 16:200 --output 100:300 --mean-gap 1 | --num-blocks 34 --max-num-batched-tokens 2048 --max-num-seqs 16 --policy priority
m003 | --n 8 --seed 104 --tenants 2 --priorities 1,0 --prompt 64:256 --output 200:300 --mean-gap 4 | --num-blocks 32 --max-num-batched-tokens 128 --max-num-seqs 4 --policy priority
m004 | --n 14 --seed 105 --tenants 3 --priorities 0,1,2 --prompt 32:128 --output 150:300 --mean-gap 0 | --num-blocks 30 --max-num-batched-tokens 512 --max-num-seqs 16 --policy priority
m005 | --n 12 --seed 106 --tenants 2 --priorities 0,1 --prompt 100:400 --output 150:300 --mean-gap 2 | --block-size 32 --num-blocks 24 --max-num-batched-tokens 1024 --max-num-seqs 8 --policy priority
m006 | --n 20 --seed 201 --tenants 2 --priorities 1,0 --late-tenants 1 --late-start 15 --prompt 32:300 --output 100:300 --mean-gap 1.5 | --num-blocks 50 --max-num-batched-tokens 512 --max-num-seqs 16 --policy priority
m007 | --n 24 --seed 202 --tenants 3 --priorities 2,1,0 --late-tenants 1 --late-start 20 --prompt 16:256 --output 80:250 --mean-gap 1.5 | --num-blocks 45 --max-num-batched-tokens 256 --max-num-seqs 16 --policy priority
m008 | --n 30 --seed 203 --tenants 3 --priorities 2,1,0 --late-tenants 2 --late-start 10 --prompt 16:400 --output 50:250 --mean-gap 1 | --num-blocks 60 --max-num-batched-tokens 1024 --max-num-seqs 32 --policy priority --long-prefill-threshold 64
m009 | --n 50 --seed 301 --tenants 3 --prefix-groups 3 --prefix-len 64:400 --prompt 16:600 --output 16:200 --mean-gap 3 | --num-blocks 60 --max-num-batched-tokens 512 --max-num-seqs 16 --prefix-caching on
m010 | --n 40 --seed 302 --tenants 3 --priorities 0,1,2 --prefix-groups 4 --prefix-len 100:300 --prompt 16:500 --output 16:200 --mean-gap 3 | --num-blocks 55 --max-num-batched-tokens 256 --max-num-seqs 8 --policy priority --prefix-caching on
m011 | --n 60 --seed 303 --tenants 4 --prefix-groups 5 --prefix-len 32:200 --prompt 16:400 --output 16:150 --mean-gap 2 | --num-blocks 40 --max-num-batched-tokens 2048 --max-num-seqs 32 --prefix-caching on
m012 | --n 50 --seed 304 --tenants 2 --prefix-groups 3 --prefix-len 64:512 --prompt 16:700 --output 16:200 --mean-gap 3 | --block-size 32 --num-blocks 40 --max-num-batched-tokens 1024 --max-num-seqs 16 --prefix-caching on
m013 | --n 50 --seed 305 --tenants 3 --prefix-groups 2 --prefix-len 128:384 --prompt 16:600 --output 16:200 --mean-gap 2 | --num-blocks 64 --max-num-batched-tokens 512 --max-num-seqs 16 --prefix-caching on --long-prefill-threshold 64
m014 | --n 50 --seed 401 --tenants 3 --prompt 16:700 --output 1:200 --mean-gap 3 | --num-blocks 60 --max-num-batched-tokens 1024 --max-num-seqs 16 --chunked-prefill off
m015 | --n 60 --seed 402 --tenants 2 --prompt 16:400 --output 1:300 --mean-gap 2 | --num-blocks 50 --max-num-batched-tokens 1024 --max-num-seqs 64 --chunked-prefill off
m016 | --n 50 --seed 403 --tenants 3 --prefix-groups 2 --prefix-len 64:256 --prompt 16:600 --output 1:200 --mean-gap 3 | --num-blocks 56 --max-num-batched-tokens 2048 --max-num-seqs 8 --chunked-prefill off --prefix-caching on
m017 | --n 40 --seed 404 --tenants 3 --priorities 0,1,2 --prompt 16:600 --output 1:200 --mean-gap 2 | --num-blocks 52 --max-num-batched-tokens 1024 --max-num-seqs 16 --chunked-prefill off --policy priority
m018 | --n 80 --seed 405 --tenants 4 --prompt 16:600 --output 16:150 --mean-gap 0.5 | --num-blocks 400 --max-num-batched-tokens 2048 --max-num-seqs 128 --long-prefill-threshold 32
m019 | --n 100 --seed 406 --tenants 5 --prompt 64:2000 --output 1:100 --log-len --mean-gap 0.3 | --num-blocks 700 --max-num-batched-tokens 4096 --max-num-seqs 256 --long-prefill-threshold 128
m020 | --n 60 --seed 407 --tenants 3 --prompt 16:700 --output 16:200 --mean-gap 1 | --num-blocks 64 --max-num-batched-tokens 1024 --max-num-seqs 64 --long-prefill-threshold 64
m021 | --n 30 --seed 501 --tenants 2 --prompt 16:2000 --output 1:300 --log-len --mean-gap 4 | --num-blocks 130 --max-num-batched-tokens 2048 --max-num-seqs 8
m022 | --n 45 --seed 502 --tenants 3 --prompt 16:800 --output 1:200 --mean-gap 2 | --num-blocks 400 --max-num-batched-tokens 512 --max-num-seqs 32
m023 | --n 60 --seed 503 --tenants 4 --prompt 16:500 --output 1:300 --log-len --mean-gap 1 | --num-blocks 800 --max-num-batched-tokens 256 --max-num-seqs 64
m024 | --n 75 --seed 504 --tenants 5 --prompt 16:1200 --output 1:150 --mean-gap 2 | --block-size 32 --num-blocks 60 --max-num-batched-tokens 4096 --max-num-seqs 64
m025 | --n 90 --seed 505 --tenants 6 --prompt 16:300 --output 1:100 --mean-gap 0.5 | --num-blocks 60 --max-num-batched-tokens 128 --max-num-seqs 16
m026 | --n 120 --seed 506 --tenants 6 --prompt 16:2000 --output 1:64 --log-len --mean-gap 1 | --num-blocks 1000 --max-num-batched-tokens 8192 --max-num-seqs 256
m027 | --n 40 --seed 507 --tenants 2 --prompt 200:2000 --output 1:300 --mean-gap 5 | --num-blocks 200 --max-num-batched-tokens 4096 --max-num-seqs 16 --chunked-prefill off
m028 | --n 100 --seed 508 --tenants 4 --prompt 16:256 --output 1:300 --log-len --mean-gap 0.8 | --num-blocks 100 --max-num-batched-tokens 512 --max-num-seqs 128
m029 | --n 50 --seed 509 --tenants 3 --prompt 16:1000 --output 100:300 --mean-gap 3 | --block-size 32 --num-blocks 120 --max-num-batched-tokens 2048 --max-num-seqs 32
m030 | --n 80 --seed 510 --tenants 5 --prompt 16:600 --output 1:200 --mean-gap 1.5 | --num-blocks 300 --max-num-batched-tokens 1024 --max-num-seqs 64
m031 | --n 35 --seed 511 --tenants 2 --prompt 16:1500 --output 1:250 --mean-gap 3 | --num-blocks 110 --max-num-batched-tokens 256 --max-num-seqs 4
m032 | --n 110 --seed 512 --tenants 6 --prompt 16:400 --output 1:120 --log-len --mean-gap 0.7 | --num-blocks 1200 --max-num-batched-tokens 8192 --max-num-seqs 256
m033 | --n 65 --seed 513 --tenants 3 --prompt 16:900 --output 1:300 --log-len --mean-gap 2 | --num-blocks 70 --max-num-batched-tokens 1024 --max-num-seqs 16
m034 | --n 55 --seed 514 --tenants 4 --prompt 16:2000 --output 1:200 --log-len --mean-gap 2 | --num-blocks 140 --max-num-batched-tokens 128 --max-num-seqs 4
m035 | --n 100 --seed 515 --tenants 5 --prompt 16:700 --output 1:150 --mean-gap 1 | --num-blocks 150 --max-num-batched-tokens 2048 --max-num-seqs 32
m036 | --n 24 --seed 601 --tenants 2 --priorities 1,0 --late-tenants 1 --late-start 10 --prompt 16:64 --output 200:300 --mean-gap 1 | --num-blocks 60 --max-num-batched-tokens 256 --max-num-seqs 32 --policy priority
m037 | --n 30 --seed 604 --tenants 3 --priorities 2,1,0 --late-tenants 1 --late-start 15 --prompt 16:300 --output 150:300 --mean-gap 0.7 | --num-blocks 50 --max-num-batched-tokens 512 --max-num-seqs 32 --policy priority --long-prefill-threshold 32
m038 | --n 40 --seed 606 --tenants 3 --priorities 2,1,0 --late-tenants 2 --late-start 12 --prompt 16:200 --output 100:300 --mean-gap 0.5 | --num-blocks 60 --max-num-batched-tokens 1024 --max-num-seqs 64 --policy priority
m039 | --n 24 --seed 607 --tenants 2 --priorities 1,0 --late-tenants 1 --late-start 10 --prompt 32:128 --output 200:300 --mean-gap 0.5 | --num-blocks 40 --max-num-batched-tokens 512 --max-num-seqs 16 --policy priority
END
)

names=()
: > "$TMP/runs.txt"
while IFS='|' read -r name gen server; do
  name=${name// /}
  names+=("$name")
  # shellcheck disable=SC2086  # the argument groups are meant to be split
  python3 "$HERE/tool.py" gen "$HERE/$name.csv" $gen
  printf '%q ' "$HERE/$name.csv" $server --quiet --out "$TMP/$name.json" \
    --victims "$TMP/$name.victims.json" >> "$TMP/runs.txt"
  echo >> "$TMP/runs.txt"
done <<< "$CASES"

# vLLM's warnings (CPU platform, no Triton, ...) go to stderr; keep them out of the way.
"$VENV/bin/python" "$HERE/tool.py" run --many "$TMP/runs.txt" 2> "$TMP/vllm.stderr" || {
  tail -20 "$TMP/vllm.stderr" >&2; exit 1; }
python3 "$HERE/tool.py" finish "$TMP" "$HERE" "${names[@]}" > "$HERE/stats.jsonl"
