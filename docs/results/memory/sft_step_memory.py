"""Peak RSS of three SFT optimizer steps (4 gold trajectories of shop-world-decide each, the claims run's SFT options:
bf16 autocast, lr 1e-5), by micro_batch_tokens, shared-prefix micro-batches and gradient checkpointing; one setting
per process (ru_maxrss is the process's peak). Usage, from the repository root:

    python docs/results/memory/sft_step_memory.py MICRO_BATCH_TOKENS SHARE(0|1) default|ckpt [MODEL]
"""
import resource, sys, time, gc
import torch
from envace.training.sft import gold_trajectories, chat_io
from envace.training.update import optimizer_step
from envace.backends.models import enable_gradient_checkpointing, load_trainable, make_optimizer
from envace.envs.suites import load_tasks_of_kinds
from envace.config import SFTConfig
from envace.math import algos

mbt, share, attn = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
cfg = SFTConfig()
model, tok = load_trainable(sys.argv[4] if len(sys.argv) > 4 else "SmolLM2-135M-Instruct", 0, 16)
if attn == "ckpt":
    enable_gradient_checkpointing(model)
elif attn != "default":
    model.config._attn_implementation = attn
opt = make_optimizer(model, 1e-5, 0.0)
tasks = load_tasks_of_kinds("shop-world-decide", "train", 32, 0, None, "x")
trajs = gold_trajectories(tok, tasks, **chat_io(cfg.rollout))
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
base = rss()
for step in range(3):
    rows = [r for t in trajs[step*4:(step+1)*4] for r in t.rows]
    t0 = time.perf_counter()
    m = optimizer_step(model, opt, rows, lambda lp, mk, ix, n: algos.sft_loss(lp, mk, "token_mean", n), agg="token_mean",
        micro_batch_tokens=mbt, temperatures={}, max_grad_norm=1.0, bf16=True, share_prefixes=share)
    print(f"mbt {mbt} share {share} attn {attn} step {step} rows {len(rows)} tokens {sum(len(r.prompt_ids)+len(r.completion_ids) for r in rows)} mb {m['micro_batches']} s {time.perf_counter()-t0:.1f} maxrss_gb {rss():.2f} (load {base:.2f})", flush=True)
