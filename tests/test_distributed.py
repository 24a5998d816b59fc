"""Data parallelism: 2 CPU processes (torchrun, gloo) give the 1-process advantages and update; rank 0 alone
checkpoints; a 2-process run resumes on 1 process.

One torchrun launch serves both behaviour tests (a process start costs ~10 s here): the worker
(tests/fixtures/dist_worker.py) takes one update over fixed rows, then runs ``envace train`` for one iteration.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envace.config import TrainConfig, load_config
from envace.training.distributed import Dist, by_index, by_name, trainable_names
from envace.core.logging import read_metrics
from envace.training.trainer import train
from numerics import assert_all_close_rel

WORKER = Path(__file__).parent / "fixtures" / "dist_worker.py"
TRAIN_ARGS = [
    "model=tiny-random",
    "suite=bank",
    "batch_tasks=3",
    "save_every=1",
    "group_size=2",
    "rollout.max_steps=2",
    "rollout.act.max_new_tokens=8",
    "rollout.rehearse.max_new_tokens=8",
    "tensorboard=false",
    "progress=false",
    "lr=1e-3",
]


def _worker():
    spec = importlib.util.spec_from_file_location("dist_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Outputs of one 2-process torchrun: the fixed-rows update (``out``) and one training iteration (``out/run``)."""
    out = tmp_path_factory.mktemp("two")
    sets = [a for kv in TRAIN_ARGS + ["iterations=1", f"out_dir={out / 'run'}"] for a in ("--set", kv)]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(WORKER),
        str(out),
        "train",
        *sets,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_two_processes_give_the_one_process_advantages_and_update(two_processes, tmp_path):
    _worker().step(str(tmp_path))  # the same update on this one process (no launcher: envace.training.distributed.Dist)
    one = json.loads((tmp_path / "adv-0.json").read_text())
    two = {
        **json.loads((two_processes / "adv-0.json").read_text()),
        **json.loads((two_processes / "adv-1.json").read_text()),
    }
    assert two == one  # whole groups on each process: the role-wise baselines are exact, bit for bit
    m1, m2 = (
        json.loads((tmp_path / "metrics.json").read_text()),
        json.loads((two_processes / "metrics.json").read_text()),
    )
    assert (
        m2["world_size"] == 2 and len(set(m2["micro_batches_per_rank"])) == 2
    )  # unequal shares: idle micro-batches ran
    assert m2["metrics"]["n_tokens"] == m1["metrics"]["n_tokens"]  # the normalizer is the whole batch's
    assert m2["metrics"]["grad_norm"] == pytest.approx(m1["metrics"]["grad_norm"], rel=1e-4)
    d1, d2 = torch.load(tmp_path / "delta.pt"), torch.load(two_processes / "delta.pt")
    assert d1.keys() == d2.keys() and any(bool(v.abs().max() > 0) for v in d1.values())
    # all-reduced sums add in another order: rounding only. AdamW's step divides by sqrt(v), which magnifies a
    # gradient's rounding where |g| is near eps (measured up to 1.7e-5 / 4e-5 elementwise), so these bounds are
    # 10x the default; the gradients themselves are pinned by n_tokens and grad_norm above
    assert_all_close_rel(d2, d1, rel=2e-4, elem=2e-3, what="update of ")


def test_two_process_training_checkpoints_once_and_resumes_on_one_process(two_processes):
    run = two_processes / "run"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert [m["step"] for m in read_metrics(str(run))] == [1]  # rank 0 alone logs
    trajs = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 3 * 2 and {t["group_id"].split("-")[1] for t in trajs} == {
        "r0",
        "r1",
    }  # both processes' groups
    by_task = {}
    for t in trajs:
        by_task.setdefault(t["task_id"], set()).add(t["group_id"])
    assert all(len(g) == 1 for g in by_task.values())  # a task's K trajectories: one group, rolled out by one process
    cfg = load_config(TrainConfig, None, TRAIN_ARGS + ["iterations=2", f"out_dir={run}"])
    res = train(cfg)  # this process: a different process count
    assert res.step == 2 and [m["step"] for m in read_metrics(str(run))] == [1, 2]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000002"
    iters = [json.loads(line)["iteration"] for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert iters == [0] * 6 + [1] * 6


def test_shards_are_disjoint_cover_the_batch_and_keep_one_process_unchanged():
    tasks = [f"t{i}" for i in range(7)]
    assert Dist().shard(tasks) == tasks
    for w in (2, 3, 8):
        parts = []
        for r in range(w):
            d = Dist()
            d.rank, d.world_size = r, w
            parts.append(d.shard(tasks))
        assert sorted(x for p in parts for x in p) == sorted(tasks) and sum(map(len, parts)) == len(tasks)


def test_optimizer_state_converts_between_index_and_name_keys():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[0].bias.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    names = trainable_names(model)
    assert names == ["0.weight", "1.weight", "1.bias"]
    sd = opt.state_dict()
    named = by_name(sd, names)
    assert set(named["state"]) == set(names) and named["param_groups"][0]["params"] == names
    back = by_index(named, names)
    assert back["param_groups"] == sd["param_groups"]
    for i, s in sd["state"].items():
        assert all(torch.equal(s[k], back["state"][i][k]) for k in s)
