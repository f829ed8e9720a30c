#!/usr/bin/env bash
# 1 process (2 threads) against 2 processes (torchrun, 1 thread each) on the same NQ-Swap slice, this machine's 2 cores.
# Writes runs/eval-parallel/{one,two}/results.json; compare.py prints the table. Usage: bash measure.sh [MODEL] [LIMIT]
set -euo pipefail
model=${1:-smollm2-135m-instruct}
limit=${2:-48}
out=runs/eval-parallel/$model-$limit
rm -rf "$out"
common=(eval --model "$model" --dataset nq-swap --limit "$limit" --methods standard,cad,fides --batch-size 8
        --max-new-tokens 16 --device cpu --bootstrap 200 --no-progress)
OMP_NUM_THREADS=2 python -m fides_rag.cli "${common[@]}" --out "$out/one" > /dev/null
OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m fides_rag.cli "${common[@]}" --out "$out/two" > /dev/null
python "$(dirname "$0")/compare.py" "$out"
