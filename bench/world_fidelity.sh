#!/usr/bin/env bash
# Rehearse fidelity of SFT warm-ups on a fixed held-out shadow set: fresh worlds (bank) vs persistent ones
# (bank-world), and the fresh-world warm-up on the persistent test set (a model that never saw the world).
# The warm-ups (30 steps x 4 gold trajectories of every kind, 256 train tasks, lr 1e-4, bf16 auto):
#   envace sft --set suite=bank-world --set steps=30 --set batch_tasks=4 --set bf16=auto --set out_dir=runs/sft-bank-world
#   envace sft --set suite=bank --set steps=30 --set batch_tasks=4 --set bf16=auto --set out_dir=runs/sft-bank
# Then: bash bench/world_fidelity.sh [N] -> docs/results/world-fidelity/*.json and summary.md
set -euo pipefail
N=${1:-24}
OUT=docs/results/world-fidelity
ENVACE=${ENVACE:-.venv/bin/envace}
mkdir -p "$OUT"
run() {  # model suite name
  [ -f "$OUT/$3.json" ] || "$ENVACE" fidelity --model "$1" --suite "$2" --split test -n "$N" -k 1 --out "$OUT/$3.json" \
    > "$OUT/$3.txt" 2>/dev/null
}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=PASSIVE  # the three side by side, one thread each
run runs/sft-bank-world bank-world sft-world_on_world &
run runs/sft-bank bank sft-fresh_on_fresh &
run runs/sft-bank bank-world sft-fresh_on_world &
wait
${PYTHON:-.venv/bin/python} bench/world_fidelity_summary.py "$OUT"
