"""The Intel demo's four models on its 100 test tasks, 4 samples per task at Act T=0.7 (per-task mean success):
is the greedy table's -0.08 a shift of the policy or a near tie tipped?"""
import os, sys
from envace.evaluation.budget import evaluate_model
from envace.evaluation.demo import demo_rollout
from envace.evaluation.trials import save_result, rate_with_ci

R = "/work/runs/demo-intel"
MODELS = {
    "sft": f"{R}/sft/checkpoints/step-000030/policy",
    "envace": f"{R}/train/checkpoints/step-000004/policy",
    "caller_only": f"{R}/train-caller_only/checkpoints/step-000004/policy",
    "real_env": f"{R}/train-real_env/checkpoints/step-000004/policy",
}
for name, path in MODELS.items():
    out = f"/work/runs/sampled/{name}.json"
    if os.path.exists(out):
        continue
    res = evaluate_model(path, "shop-world", "test", 100, 4, seed=1, rollout=demo_rollout(), bf16="auto", backend="auto")
    save_result(res, out, config={"model": path, "samples": 4, "temperature": 0.7, "seed": 1})
    print(name, rate_with_ci(res.metrics), flush=True)
