"""Nothing lost: kill -9 at random points of a training run and resume; checkpoints are never half-written;
metrics and trajectories logs end with no gaps, no duplicates and no torn lines. Determinism: the same seed and
config give the same rollouts and the same first update on CPU. Firewall: a rehearsal training run never
creates or calls a real environment once its tasks are loaded."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from envace.backends.base import SamplingParams
from envace.core.checkpoint import latest_checkpoint, load_state, save_checkpoint
from envace.config import TrainConfig
from envace.envs import Environment
from envace.core.logging import read_metrics, truncate_jsonl
from envace.rewards.functions import REWARDS, RewardResult
from envace.rollout.engine import RolloutConfig

# ------------------------------------------------------------------------------------------------ helpers


def check_checkpoints(root: Path) -> list[int]:
    """Every folder named step-* is a complete checkpoint that loads; ``latest`` names one of them."""
    from safetensors.torch import load_file

    steps = []
    for d in sorted(root.glob("step-*")):
        state = load_state(str(d))
        assert state["step"] == int(d.name.split("-")[1]), d
        torch.load(d / "optimizer.pt", weights_only=False)
        torch.load(d / "rng.pt", weights_only=False)
        json.loads((d / "policy" / "config.json").read_text())
        assert load_file(str(d / "policy" / "model.safetensors")), d
        steps.append(state["step"])
    if (root / "latest").exists():
        ckpt = latest_checkpoint(str(root))
        assert ckpt is not None and Path(ckpt).name in {d.name for d in root.glob("step-*")}, (
            "latest names a missing checkpoint"
        )
    return steps


def check_jsonl(path: Path) -> list[dict]:
    """Complete JSON lines; only the very last line may be torn (a kill in the middle of an append)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    recs = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            recs.append(json.loads(line))
        except ValueError:
            assert i == len(lines) - 1, f"{path.name}: a broken line that is not the last one: {line[:80]!r}"
    return recs


def _progress(out: Path) -> tuple[int, int, int]:
    sizes = [(out / n).stat().st_size if (out / n).exists() else 0 for n in ("trajectories.jsonl", "metrics.jsonl")]
    ckpts = out / "checkpoints"
    return sizes[0], sizes[1], len(list(ckpts.iterdir())) if ckpts.exists() else 0


ITERATIONS = 16


def _args(out: Path) -> list[str]:
    sets = {
        "model": "tiny-random",
        "suite": "bank",
        "iterations": ITERATIONS,
        "batch_tasks": 1,
        "save_every": 2,
        "keep_checkpoints": 2,
        "group_size": 2,
        "rollout.max_steps": 2,
        "rollout.act.max_new_tokens": 8,
        "rollout.rehearse.max_new_tokens": 8,
        "tensorboard": "false",
        "progress": "false",
        "out_dir": str(out),
        "lr": "1e-3",
    }
    return [sys.executable, "-m", "envace.cli", "train"] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


# ------------------------------------------------------------------------------------------------ kill -9


def _latest(out: Path) -> str:
    p = out / "checkpoints" / "latest"
    return p.read_text().strip() if p.exists() else ""


def _tmp_dirs(out: Path) -> set[str]:
    ck = out / "checkpoints"
    return {p.name for p in ck.iterdir() if p.name.startswith(".tmp-step-")} if ck.exists() else set()


def _steps_logged(out: Path) -> int:
    return len(check_jsonl(out / "metrics.jsonl"))


def test_kill_9_at_random_points_then_resume_loses_nothing(tmp_path):
    """Three kills in one run: a random moment two to four iterations into the first start, the middle of a
    checkpoint write, a random moment two to four iterations into the third start; after each, checkpoints and
    logs are checked; a fourth start finishes the run. The kill points follow the run's progress, not the clock,
    so a fast machine cannot finish the run before the kill."""
    seed = int(os.environ.get("ENVACE_KILL_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    out = tmp_path / "run"
    kills = []
    for trial in ("random", "mid-checkpoint", "random"):
        tmp_before, start = _tmp_dirs(out), _steps_logged(out)
        target = start + rng.randint(2, 4)  # kill once this many steps are logged, a random moment later
        log = open(tmp_path / f"stderr-{len(kills)}.txt", "wb")
        proc = subprocess.Popen(_args(out), stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if trial == "mid-checkpoint" and _tmp_dirs(out) - tmp_before:
                break  # a checkpoint is being written right now
            steps = _steps_logged(out)
            if trial == "random" and steps >= target:
                time.sleep(rng.uniform(0.0, 0.05))  # somewhere inside the next iteration
                break
            if trial == "mid-checkpoint" and steps >= start + 4:
                break  # every write was too quick to catch: kill anyway rather than let the run finish
            time.sleep(0.002)
        killed_live = proc.poll() is None
        if killed_live:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()
        assert proc.returncode in (0, -signal.SIGKILL), (
            proc.returncode,
            (tmp_path / f"stderr-{len(kills)}.txt").read_text()[-3000:],
        )
        kills.append((trial, killed_live, _latest(out), len(check_jsonl(out / "metrics.jsonl"))))
        # after every kill: nothing half-written
        check_checkpoints(out / "checkpoints")
        check_jsonl(out / "metrics.jsonl")
        check_jsonl(out / "trajectories.jsonl")
        if len(kills) == 1:  # make sure the resume meets a torn tail in both logs
            with open(out / "trajectories.jsonl", "a") as f:
                f.write('{"id": "i9-0:torn/0", "iteration": 1, "messa')
            with open(out / "metrics.jsonl", "a") as f:
                f.write('{"step": 2, "reward/me')
    print(f"kill seed {seed}: {kills}")
    assert sum(k[1] for k in kills) >= 2, f"the run should be killed while alive (seed {seed}): {kills}"
    subprocess.run(_args(out), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    # the finished run: every step logged once, every iteration's trajectories once, the last checkpoint complete
    assert [m["step"] for m in read_metrics(str(out))] == list(range(1, ITERATIONS + 1)), f"seed {seed}, kills {kills}"
    trajs = check_jsonl(out / "trajectories.jsonl")
    assert len(trajs) == len(json.loads(json.dumps(trajs)))  # no torn line left
    assert [t["iteration"] for t in trajs] == sorted(it for it in range(ITERATIONS) for _ in range(2)), (
        f"seed {seed}, kills {kills}"
    )
    assert len({t["id"] for t in trajs}) == len(trajs)
    assert check_checkpoints(out / "checkpoints")[-1] == ITERATIONS
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step-{ITERATIONS:06d}"
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------------------------ units


def test_truncate_jsonl_drops_the_torn_tail_and_records_past_the_resume_point(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"iteration": 0}\n{"iteration": 1}\nnot json\n{"iteration": 2}\n{"iteration": 3, "x": [1, 2')
    assert truncate_jsonl(str(p), lambda r: r["iteration"] < 2) == 3
    assert p.read_text() == '{"iteration": 0}\n{"iteration": 1}\n'
    q = tmp_path / "complete_but_unterminated.jsonl"
    q.write_text('{"step": 1}\n{"step": 2}')
    truncate_jsonl(str(q), lambda r: True)
    assert q.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert truncate_jsonl(str(tmp_path / "missing.jsonl"), lambda r: True) == 0


class _FakeModel:
    def save_pretrained(self, path, safe_serialization=True):
        os.makedirs(path, exist_ok=True)
        for i in range(5):
            Path(path, f"shard-{i}.bin").write_bytes(b"w" * 1000)


def _complete(folder: Path) -> bool:
    return (folder / "state.json").exists() and len(list((folder / "policy").glob("shard-*"))) == 5


def test_an_interrupted_prune_or_resave_never_leaves_a_half_checkpoint(tmp_path, monkeypatch):
    import shutil

    import envace.core.checkpoint as ck

    root = tmp_path / "ckpt"
    models, opts = {"policy": _FakeModel()}, {}
    for step in (1, 2):
        save_checkpoint(str(root), step, models, opts, {}, keep=2)
    real_rmtree = shutil.rmtree

    def killed_rmtree(path, ignore_errors=False):  # deletes one file, then the process "dies"
        victims = sorted(Path(path).rglob("shard-*"))
        if victims:
            victims[0].unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(str(root), 3, models, opts, {}, keep=2)  # prunes step-1 and dies inside the deletion
    assert all(_complete(d) for d in root.glob("step-*")) and latest_checkpoint(str(root)).endswith("step-000003")
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(str(root), 3, models, opts, {}, keep=2)  # a re-save of an existing step dies too
    assert all(_complete(d) for d in root.glob("step-*")) and (root / "step-000003").exists()
    monkeypatch.setattr(ck.shutil, "rmtree", real_rmtree)
    save_checkpoint(str(root), 4, models, opts, {}, keep=2)  # the next save clears the leftovers
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000003", "step-000004"]


# ----------------------------------------------------------------------------------------- determinism + firewall


def _first_of_group(task, traj, ctx):
    """A reward that differs within every group (a random tiny model never earns a real one), so the update moves."""
    return RewardResult(1.0 if traj.id.endswith("/0") else 0.0)


def _cfg(out: Path, variant: str = "envace") -> TrainConfig:
    rc = RolloutConfig(
        max_steps=2,
        act=SamplingParams(max_new_tokens=12),
        rehearse=SamplingParams(max_new_tokens=12, stop=["</observation>"]),
    )
    return TrainConfig(
        model="tiny-random",
        suite="bank",
        variant=variant,
        iterations=1,
        batch_tasks=1,
        n_train_tasks=4,
        lr=1e-3,
        group_size=2,
        rollout=rc,
        out_dir=str(out),
        tensorboard=False,
        progress=False,
        save_every=1,
        seed=7,
        reward="reliability_first_of_group",
    )


def test_same_seed_same_rollouts_same_first_update_and_no_real_env_after_loading(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setitem(REWARDS._entries, "reliability_first_of_group", _first_of_group)  # only for this test

    import envace.training.trainer as trainer

    loaded = {"done": False}
    real_load_tasks = trainer.load_tasks_of_kinds

    def load_tasks(*a, **kw):
        tasks = real_load_tasks(*a, **kw)  # task generation runs the built-in tools: that is data, not rollout
        loaded["done"] = True
        return tasks

    real_init = Environment.__init__

    def init(self, task):
        assert not loaded["done"], "a real environment was created during rehearsal training"
        real_init(self, task)

    monkeypatch.setattr(trainer, "load_tasks_of_kinds", load_tasks)
    monkeypatch.setattr(Environment, "__init__", init)
    runs = []
    for name in ("a", "b"):
        loaded["done"] = False
        res = trainer.train(_cfg(tmp_path / name))
        runs.append(Path(res.out_dir))
    t_a, t_b = ((r / "trajectories.jsonl").read_text() for r in runs)
    assert t_a == t_b and t_a.count("\n") == 2
    assert any(json.loads(line)["steps"] for line in t_a.splitlines())  # the rollouts did something
    w_a, w_b = (load_file(str(r / "checkpoints" / "step-000001" / "policy" / "model.safetensors")) for r in runs)
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)  # bitwise
    init_w = load_file(
        str(
            Path(os.path.expanduser(os.environ.get("ENVACE_CACHE", "~/.cache/envace")))
            / "models"
            / "tiny-random"
            / "model.safetensors"
        )
    )
    assert any(not torch.equal(init_w[k], w_a[k]) for k in w_a if k in init_w)  # and the update did change them
    m_a, m_b = ({k: v for k, v in read_metrics(str(r))[0].items() if not k.startswith("perf/")} for r in runs)
    assert m_a == m_b
