#!/usr/bin/env bash
# The whole bench suite with the sizes docs/benchmarks.md reports (sequential: contenders must not overlap).
# REF is the revision the before/after columns compare with (the last commit before the performance work);
# ROLLOUT_REF (optional, e.g. 047e69e: before continuous batching) adds a before/after rollout contender.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PY:-../.venv/bin/python}
REF=${REF:-b2d4f0a}
$PY rollout_throughput.py --tasks 8 --group 8 --bf16 ${ROLLOUT_REF:+--ref "$ROLLOUT_REF"}
$PY turn_scaling.py --turns 16 --group 2 --full-turns 8
$PY train_throughput.py --tasks 1 --group 4 --ref "$REF"
$PY end_to_end.py --tasks 1 --group 4 --variants envace,envace+bf16,real_env,simulator
