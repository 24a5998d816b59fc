"""The paper's comparison in miniature: one config, every arm, several seeds, one report folder.

For each seed: an SFT warm-up from ``model`` (shared by every arm that needs it), then each arm of
:data:`ARMS` produces its models, and every arm is evaluated the same way:

- **base**: ``model`` untouched; **sft**: the warm-up checkpoint;
- **RL arms** (one per :data:`envace.config.VARIANTS` entry: ``real_env``, ``envace``, ``per_role``,
  ``simulator``, ``caller_frozen``, ``caller_only``): role-wise GRPO from the SFT checkpoint with the *same*
  budget (``iterations`` x ``batch_tasks`` tasks x ``group_size`` trajectories, same reward, same rollout limits).
- **evaluation**: held-out tasks in the real environment, ``eval_samples`` trials each, at every rehearsal
  budget N of ``tts_budgets`` (N=0: plain acting; N>0: private rehearsal in each mode of ``tts_modes``,
  envace.tts) -- see envace.evaluation;
- **rehearsal fidelity**: shadow rollouts of held-out tasks, each rehearsed observation scored against the real
  one (envace.fidelity), with the arm's own Rehearse model (the policy; the second model for ``per_role``; the
  frozen simulator for ``simulator``).

Everything goes to ``out_dir``: ``results.json`` (each evaluation with its metrics and per-task outcomes; rewritten after every arm; a rerun with the same config skips
the (arm, seed) pairs already there -- ``seeds`` may differ: more seeds are added, fewer are reported -- and training itself resumes from its checkpoints), the per-arm training
folders, and the report (``report.md``, ``report.html``, PNG figures, ``trajectories.html``; see envace.report).

Departures, all at CPU scale: tiny budgets; the per-role and simulator arms rehearse with their *policy* at test
time (envace.tts has one model); fidelity is measured on the policy's own rollouts, so arms differ in the calls
they make as well as in the observations they imagine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .backends.base import SamplingParams
from .config import SFTConfig, TrainConfig, VARIANTS, config_diff, describe_diff, from_dict, load_config, to_dict
from .registry import Registry
from .rollout import RolloutConfig


def _small_rollout() -> RolloutConfig:
    return RolloutConfig(group_size=4, max_steps=6, max_steps_per_turn=4, act=SamplingParams(temperature=1.0, max_new_tokens=96), rehearse=SamplingParams(temperature=0.6, top_p=0.8, max_new_tokens=96, stop=["</observation>"]))


@dataclass
class ExperimentConfig:
    """The paper's comparison at CPU scale (see the module docstring). Loadable from YAML (``envace experiment
    --config F --set key=value``)."""

    model: str = "SmolLM2-135M-Instruct"
    """Base model of every arm (the embedded default, "tiny-random", a local model folder, or a training checkpoint /
    run folder, LoRA ones merged: envace.models.load)."""
    suite: str = "builtin"
    """Task suite: training tasks from its train split, evaluation tasks from ``eval_split``."""
    arms: tuple[str, ...] = ("base", "sft", "real_env", "envace", "per_role", "simulator")
    """Arms to run (envace.experiment.ARMS): base, sft, and any training variant."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """One full run of every arm per seed; the report shows mean +- std over seeds."""
    sft_steps: int = 60
    """SFT warm-up optimizer steps (shared start of every RL arm)."""
    sft_tasks: int = 256
    """Gold trajectories for the warm-up."""
    sft_batch_tasks: int = 8
    sft_lr: float = 1e-4
    iterations: int = 8
    """RL iterations, the same for every RL arm (the equal compute budget)."""
    batch_tasks: int = 4
    """B: tasks per RL iteration."""
    group_size: int = 4
    """K: trajectories per task (GRPO group)."""
    lr: float = 2e-6
    """RL learning rate (all RL arms)."""
    reward: Any = "gold_f1"
    """RL reward spec (envace.rewards); "grounded" would put the real environment in every arm's loop."""
    train_tasks: int | None = None
    """Training tasks to draw batches from (None: the suite's default)."""
    rollout: RolloutConfig = field(default_factory=_small_rollout)
    """Rollout limits and sampling for training, rehearsal attempts and fidelity rollouts (mode and group size
    are set per use)."""
    eval_split: str = "test"
    eval_tasks: int = 30
    """Held-out tasks per evaluation."""
    eval_samples: int = 1
    """Real trials per task (pass^k for k <= eval_samples)."""
    eval_temperature: float = 0.0
    """Act temperature of the real trials (0 = greedy; use > 0 with eval_samples > 1)."""
    tts_budgets: tuple[int, ...] = (0, 1, 2, 3)
    """Rehearsal budgets N evaluated for every arm (0 = no rehearsal)."""
    tts_modes: tuple[str, ...] = ("parallel", "sequential")
    """Test-time rehearsal modes for N > 0 (envace.tts.REHEARSAL_MODES)."""
    tts_memory: str = "model"
    """How the rehearsal memory is made (envace.tts.MEMORY_BUILDERS): model | concat."""
    tts_max_new_tokens: int = 160
    """Token limit of each reflection and memory generation."""
    fidelity_tasks: int = 8
    """Held-out tasks rolled out in shadow mode per arm for rehearsal fidelity (0: skip)."""
    fidelity_samples: int = 2
    """Shadow trajectories per fidelity task."""
    viewer_trajectories: int = 4
    """Shadow trajectories per arm (first seed) kept for the trajectory viewer."""
    out_dir: str = "runs/experiment"
    resume: bool = True
    """Skip (arm, seed) pairs already in out_dir/results.json written with the same config."""
    progress: bool = True

    def __post_init__(self) -> None:
        from .tts import MEMORY_BUILDERS, REHEARSAL_MODES

        self.arms = tuple(self.arms)
        self.seeds = tuple(int(s) for s in self.seeds)
        self.tts_budgets = tuple(sorted({int(n) for n in self.tts_budgets}))
        self.tts_modes = tuple(self.tts_modes)
        if isinstance(self.rollout, dict):
            self.rollout = from_dict(RolloutConfig, self.rollout)
        for a in self.arms:
            ARMS.get(a)  # raises, listing the valid arms
        for m in self.tts_modes:
            REHEARSAL_MODES.get(m)
        MEMORY_BUILDERS.get(self.tts_memory)
        if len(set(self.arms)) != len(self.arms) or not self.arms:
            raise ValueError(f"arms must be a non-empty list without repeats, got {self.arms}")
        if not self.seeds or not self.tts_budgets or min(self.tts_budgets) < 0:
            raise ValueError("seeds and tts_budgets must be non-empty and budgets >= 0")
        if self.eval_tasks < 1 or self.eval_samples < 1 or self.fidelity_tasks < 0 or self.fidelity_samples < 1:
            raise ValueError("eval_tasks, eval_samples, fidelity_samples >= 1 and fidelity_tasks >= 0 are required")


# --------------------------------------------------------------------------------------------------------
# Arms
# --------------------------------------------------------------------------------------------------------


@dataclass
class ArmModels:
    """What an arm produced for one seed: the model folders to evaluate and its training log."""

    policy: str
    """Act model (also Rehearse, unless ``rehearser`` / ``simulator`` is set)."""
    rehearser: str | None = None
    """The second model of the per-role arm (plays Rehearse)."""
    simulator: str | None = None
    """The frozen external simulator of the simulator arm."""
    curve: list[dict[str, Any]] = field(default_factory=list)
    """Training metrics, one dict per step (empty for untrained arms)."""


class SeedRun:
    """One seed's shared state: its folder and the SFT warm-up (run once, on first use, reused on a rerun)."""

    def __init__(self, cfg: ExperimentConfig, seed: int):
        self.cfg, self.seed = cfg, seed
        self.dir = os.path.join(cfg.out_dir, f"seed{seed}")
        self._sft: tuple[str, list[dict[str, Any]]] | None = None

    def sft(self) -> tuple[str, list[dict[str, Any]]]:
        """(SFT checkpoint folder, SFT metrics)."""
        if self._sft is None:
            from .sft import sft

            out = os.path.join(self.dir, "sft")
            done = os.path.join(out, "done.json")
            if os.path.exists(done):
                with open(done, encoding="utf-8") as f:
                    d = json.load(f)
                self._sft = (d["checkpoint"], d["metrics"])
            else:
                c = self.cfg
                _say(f"seed {self.seed}: SFT warm-up ({c.sft_steps} steps on {c.sft_tasks} gold trajectories)")
                res = sft(SFTConfig(model=c.model, suite=c.suite, n_tasks=c.sft_tasks, steps=c.sft_steps, batch_tasks=c.sft_batch_tasks, lr=c.sft_lr, out_dir=out, seed=self.seed, tensorboard=False, progress=c.progress))
                self._sft = (res.checkpoint, res.metrics)
                with open(done, "w", encoding="utf-8") as f:
                    json.dump({"checkpoint": res.checkpoint, "metrics": res.metrics}, f)
        return self._sft


@dataclass(frozen=True)
class Arm:
    doc: str
    build: Callable[[SeedRun], ArmModels]


ARMS: Registry[Arm] = Registry("experiment arm")
ARMS.add("base", Arm("the base model, no training", lambda run: ArmModels(policy=run.cfg.model)))
ARMS.add("sft", Arm("SFT warm-up on gold trajectories", lambda run: ArmModels(*run.sft()[:1], curve=run.sft()[1])))


def _rl_arm(variant: str) -> Callable[[SeedRun], ArmModels]:
    def build(run: SeedRun) -> ArmModels:
        from .trainer import train

        c = run.cfg
        start, _ = run.sft()
        rc = dataclasses.replace(c.rollout, group_size=c.group_size, progress=False)
        tcfg = TrainConfig(
            model=start, suite=c.suite, n_train_tasks=c.train_tasks, variant=variant, reward=c.reward, iterations=c.iterations,
            batch_tasks=c.batch_tasks, lr=c.lr, rollout=rc, out_dir=os.path.join(run.dir, variant), save_every=max(1, c.iterations),
            keep_checkpoints=1, seed=run.seed, tensorboard=False, progress=c.progress,
        )
        res = train(tcfg)
        ckpt = res.checkpoint
        models = ArmModels(policy=os.path.join(ckpt, "policy") if ckpt else start, curve=res.metrics)
        if variant == "per_role":
            models.rehearser = os.path.join(ckpt, "rehearser") if ckpt else start
        if variant == "simulator":
            models.simulator = start  # the trainer's simulator: the frozen initial (SFT) weights
        return models

    return build


for _v in VARIANTS.names():
    ARMS.add(_v, Arm(VARIANTS.get(_v).doc + " (GRPO from the SFT checkpoint)", _rl_arm(_v)))


# --------------------------------------------------------------------------------------------------------
# Evaluation of one arm
# --------------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[experiment] {msg}", flush=True)


def budgets(cfg: ExperimentConfig) -> list[tuple[int, str]]:
    """The (N, mode) pairs evaluated: N=0 once (mode "none"), every N > 0 in every mode."""
    out: list[tuple[int, str]] = []
    for n in cfg.tts_budgets:
        out += [(0, "none")] if n == 0 else [(n, m) for m in cfg.tts_modes]
    return out


def evaluate_arm(cfg: ExperimentConfig, models: ArmModels, seed: int, label: str = "") -> dict[str, Any]:
    """Real-environment evaluation at every (N, mode), then rehearsal fidelity; JSON-able."""
    from .backends.hf import HFBackend
    from .envs import load_tasks
    from .evaluation import evaluate_at_budget
    from .fidelity import measure_fidelity
    from .models import load

    m, tok = load(models.policy)
    policy = HFBackend(m, tok)
    tasks = load_tasks(cfg.suite, cfg.eval_split, n=cfg.eval_tasks, seed=0)  # the same held-out tasks for every seed
    rc = dataclasses.replace(cfg.rollout, mode="real", act=cfg.rollout.act.with_(temperature=cfg.eval_temperature), seed=seed, progress=cfg.progress)
    tts_options = {
        "memory": cfg.tts_memory,
        "reflect_sampling": SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=cfg.tts_max_new_tokens),
        "memory_sampling": SamplingParams(temperature=0.0, max_new_tokens=cfg.tts_max_new_tokens),
        "final_act": rc.act,
    }
    attempts_rc = dataclasses.replace(rc, act=cfg.rollout.act)  # rehearsal attempts sample at the training temperature
    evals = []
    for n, mode in budgets(cfg):
        _say(f"{label}: evaluating at N={n}" + (f" ({mode})" if n else "") + f" on {len(tasks)} tasks x {cfg.eval_samples}")
        res = evaluate_at_budget(policy, tasks, samples=cfg.eval_samples, rollout=rc if n == 0 else attempts_rc, n=n, mode=mode, tts_options=tts_options)
        policy.release_all()
        evals.append({"n": n, "mode": mode, "metrics": res.metrics, "per_task": res.per_task})  # per-task outcomes: paired comparisons
    out: dict[str, Any] = {"evals": evals, "fidelity": None, "examples": []}
    if cfg.fidelity_tasks > 0:
        _say(f"{label}: rehearsal fidelity on {cfg.fidelity_tasks} tasks x {cfg.fidelity_samples} (shadow mode)")
        ftasks = load_tasks(cfg.suite, cfg.eval_split, n=cfg.fidelity_tasks, seed=0)
        extra: dict[str, Any] = {}
        mode = "rehearsal"
        if models.rehearser:
            extra["rehearser"], mode = HFBackend(*load(models.rehearser)), "per_role"
        elif models.simulator:
            extra["simulator"], mode = HFBackend(*load(models.simulator)), "simulator"
        fcfg = dataclasses.replace(cfg.rollout, mode=mode, group_size=cfg.fidelity_samples, seed=seed, progress=cfg.progress)
        fid = measure_fidelity(policy, ftasks, fcfg, **extra)
        out["fidelity"] = fid.summary
        keep = [t for t in fid.trajectories if any(s in ("rehearsed", "simulator") for st in t.steps for s in st.sources)]
        out["examples"] = [t.to_dict(with_rows=False) for t in (keep or fid.trajectories)[: cfg.viewer_trajectories]]
    return out


# --------------------------------------------------------------------------------------------------------
# The whole experiment
# --------------------------------------------------------------------------------------------------------


@dataclass
class ExperimentResult:
    out_dir: str
    results: dict[str, Any]
    """The content of results.json: config, and runs[arm][seed] = {curve, evals, fidelity, examples, ...}."""
    report: dict[str, str] = field(default_factory=dict)
    """Report file kind -> path (see envace.report.write_report)."""


def _write_json(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


RESUMABLE = ("progress", "resume", "out_dir", "seeds")
"""Fields that do not change any one (arm, seed) result: seeds may be added (or reported as a subset) by a rerun
in the same out_dir."""


def run_experiment(cfg: ExperimentConfig) -> ExperimentResult:
    """Run every arm for every seed, evaluate, and write results.json and the report into ``cfg.out_dir``."""
    from .evaluation import rate_with_ci
    from .report import write_report

    os.makedirs(cfg.out_dir, exist_ok=True)
    path = os.path.join(cfg.out_dir, "results.json")
    conf = to_dict(cfg)
    results: dict[str, Any] = {"config": conf, "arms": list(cfg.arms), "docs": {a: ARMS.get(a).doc for a in cfg.arms}, "runs": {}}
    if not cfg.resume:
        _say(f"resume=false: starting over in {cfg.out_dir}")
        for seed in cfg.seeds:
            shutil.rmtree(os.path.join(cfg.out_dir, f"seed{seed}"), ignore_errors=True)
    elif os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if diff := config_diff(old.get("config", {}), conf, ignore=RESUMABLE):
            raise ValueError(f"{cfg.out_dir} holds an experiment with another config ({describe_diff(diff)}); choose another out_dir, or set resume=false to start over there")
        results["runs"] = old.get("runs", {})
    t0 = time.perf_counter()
    total = len(cfg.seeds) * len(cfg.arms)
    done = 0
    for seed in cfg.seeds:
        run = SeedRun(cfg, seed)
        for arm in cfg.arms:
            done += 1
            label = f"[{done}/{total}] seed {seed} arm {arm}"
            if str(seed) in results["runs"].get(arm, {}):
                _say(f"{label}: done before, skipped")
                continue
            _say(f"{label}: {ARMS.get(arm).doc}")
            t_arm = time.perf_counter()
            models = ARMS.get(arm).build(run)
            t_train = time.perf_counter() - t_arm
            rec = evaluate_arm(cfg, models, seed, label)
            rec |= {"models": {"policy": models.policy, "rehearser": models.rehearser, "simulator": models.simulator}, "curve": models.curve, "train_s": t_train, "eval_s": time.perf_counter() - t_arm - t_train}
            results["runs"].setdefault(arm, {})[str(seed)] = rec
            results["elapsed_s"] = time.perf_counter() - t0
            _write_json(path, results)
            head = next(e for e in rec["evals"] if e["n"] == min(cfg.tts_budgets))["metrics"]
            _say(f"{label}: success {rate_with_ci(head)}, tool F1 {head['tool_f1']:.3f} ({time.perf_counter() - t_arm:.0f}s)")
    _write_json(path, results)  # every seed ever run here; the report shows the config's seeds
    shown = {**results, "runs": {arm: {s: r for s, r in runs.items() if int(s) in cfg.seeds} for arm, runs in results["runs"].items()}}
    _say(f"writing the report (seeds {', '.join(map(str, cfg.seeds))})")
    files = write_report(shown, cfg.out_dir)
    _say(f"done in {time.perf_counter() - t0:.0f}s; report: {files['html']}")
    return ExperimentResult(cfg.out_dir, results, files)


def load_experiment_config(path: str | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    return load_config(ExperimentConfig, path, overrides)


__all__ = ["ExperimentConfig", "ArmModels", "Arm", "ARMS", "SeedRun", "budgets", "evaluate_arm", "ExperimentResult", "run_experiment", "load_experiment_config"]
