"""Evaluation at a test-time budget: plain acting (N = 0) or private rehearsal first (N > 0), and a model by name.

This module sits above both :mod:`envace.evaluation.trials` (real-environment trials and their metrics) and
:mod:`envace.evaluation.tts` (private rehearsal as a policy), which never call each other: a budget-N evaluation
is one call down, ``trials.evaluate(tts.Rehearsing(backend, config), ...)``; evaluate runs it as it runs any
policy (:mod:`envace.evaluation.policy`), and the policy's records, metrics and tokens come back with its trials.

- :func:`evaluate_at_budget`: N = 0 is ``trials.evaluate`` of the backend; N > 0 of a ``Rehearsing`` policy
  (:func:`evaluate_with_tts`). Either way the metrics gain ``tts/n`` and ``gen_tokens_per_task`` (every
  generated token per task, rehearsal included).
- :func:`evaluate_with_tts` / :func:`run_tts`: a budget given as a ``TTSConfig``; the result, or the records alone.
- :func:`evaluate_model`: opens a backend for a model (``envace.backends.loaders.open_backend``), loads the tasks
  of a suite and split, evaluates at budget ``tts_n`` and adds the suite's own report (``envace eval``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..backends.base import Backend, SamplingParams
from .trials import EvalResult, evaluate
from ..rollout.engine import RolloutConfig
from .tts import RehearsalRecord, Rehearsing, TTSConfig
from ..core.types import Task


def evaluate_at_budget(
    policy: Backend,
    tasks: list[Task],
    samples: int = 1,
    rollout: RolloutConfig | None = None,
    n: int = 0,
    mode: str = "parallel",
    tts: TTSConfig | None = None,
    tts_options: dict[str, Any] | None = None,
    seed: int | None = None,
) -> EvalResult:
    """:func:`envace.evaluation.trials.evaluate` after private test-time rehearsal with budget ``n`` (METHOD.md section
    3).

    ``n == 0`` is plain ``evaluate``. ``n > 0`` is :func:`evaluate_with_tts` with ``tts`` (its other options: memory,
    sampling, final Act, caps; default ``TTSConfig()``) at ``n``, ``mode`` and ``rollout`` in rehearsal mode: the
    attempts are self-rehearsed (no real call), then each task runs ``samples`` times for real with the rehearsal
    memory. The result's metrics gain ``tts/...`` keys and ``gen_tokens_per_task`` counts rehearsal tokens too.
    ``tts_options`` (a dict of TTSConfig fields) is the old spelling, kept one version with a warning. ``seed``
    seeds the run (None: ``tts.seed``, else the deprecated ``rollout.seed``)."""
    rollout = rollout or RolloutConfig()
    tts = _tts_config(tts, tts_options)
    if n < 0:
        raise ValueError(f"rehearsal budget n must be >= 0, got {n}")
    if n == 0:
        res = evaluate(policy, tasks, samples=samples, rollout=rollout, seed=seed if seed is not None else tts.seed)
        res.metrics["tts/n"] = 0.0
        res.metrics["gen_tokens_per_task"] = res.metrics["act_tokens_per_traj"] * samples
        return res
    if (rollout.mode, rollout.shadow) != ("rehearsal", False):  # (deprecated fields: the attempts never run the world)
        rollout = dataclasses.replace(rollout, mode="rehearsal", shadow=False)
    tcfg = dataclasses.replace(tts, n=n, mode=mode, rollout=rollout, seed=seed if seed is not None else tts.seed)
    res = evaluate_with_tts(policy, tasks, tcfg, samples=samples)
    res.metrics["gen_tokens_per_task"] = res.metrics["act_tokens_per_traj"] * samples + res.metrics.get(
        "tts/rehearsal_tokens_per_task", 0.0
    )
    return res


def _tts_config(tts: TTSConfig | None, tts_options: dict[str, Any] | None) -> TTSConfig:
    """``tts``, or a TTSConfig of the deprecated ``tts_options`` dict (with a warning), or the default."""
    if tts_options is not None:
        import warnings

        warnings.warn(
            "tts_options (a dict) is deprecated: pass tts=TTSConfig(...) (envace.evaluation.tts.TTSConfig)",
            DeprecationWarning,
            stacklevel=3,
        )
        if tts is not None:
            raise ValueError("give tts or tts_options, not both")
        return TTSConfig(**tts_options)
    return tts or TTSConfig()


def evaluate_with_tts(policy: Backend, tasks: list[Task], cfg: TTSConfig, samples: int = 1) -> EvalResult:
    """Rehearse privately (once per task), then run every task ``samples`` times for real with m_x: ``evaluate``
    of the policy :class:`envace.evaluation.tts.Rehearsing` (acting with ``cfg.final_rollout()``).

    The metrics are :func:`envace.evaluation.trials.evaluate`'s (success_rate, pass^k, call_f1, ...) plus ``tts/…``
    ones; ``records`` holds one RehearsalRecord per task, whose ``final`` is the task's first real run (all runs
    are in ``trajectories``)."""
    return evaluate(Rehearsing(policy, cfg), tasks, samples=samples, rollout=cfg.final_rollout(), seed=cfg.run_seed)


def run_tts(policy: Backend, tasks: list[Task], cfg: TTSConfig) -> list[RehearsalRecord]:
    """Private rehearsal, then the single real execution of each task; one complete record per task."""
    return evaluate_with_tts(policy, tasks, cfg, samples=1).records


def evaluate_model(
    model: str,
    suite: str,
    split: str = "test",
    n: int | None = 20,
    samples: int = 1,
    seed: int = 0,
    tts_n: int = 0,
    tts_mode: str = "parallel",
    rollout: RolloutConfig | None = None,
    temperature: float | None = None,
    progress: bool = True,
    tts: TTSConfig | None = None,
    bf16: bool | str = False,
    backend: str = "hf",
    backend_options: dict[str, Any] | None = None,
    tts_options: dict[str, Any] | None = None,
) -> EvalResult:
    """Evaluate ``model`` on ``n`` tasks of ``suite`` / ``split`` at rehearsal budget ``tts_n``. ``backend`` says what
    generates (:func:`envace.backends.loaders.open_backend`, with ``backend_options``): ``hf`` loads ``model`` here (a
    name, a model or LoRA adapter folder, a training checkpoint or run folder: see :func:`envace.backends.models.load`;
    ``bf16``: generate in bf16, true, false or ``"auto"``, see ``HFBackend``), ``http`` asks the server at the URL
    ``model``, ``vllm`` starts a vLLM engine. The real trials sample Act greedily when ``samples == 1`` and at T=0.7
    otherwise, unless ``temperature`` is given; rehearsal attempts keep ``rollout.act``. ``tts``: the other
    test-time options (its n, mode and rollout come from ``tts_n``, ``tts_mode`` and ``rollout``; its ``final_act``,
    if None, is the trials' Act sampling)."""
    from ..backends.loaders import open_backend
    from ..envs import load_tasks, suite_summary

    tasks = load_tasks(suite, split, n=n, seed=seed)  # first: a bad suite or split fails before a model loads
    policy = open_backend(model, backend, backend_options, bf16=bf16)
    base = rollout or RolloutConfig(act=SamplingParams(max_new_tokens=160))
    final_act = base.act.with_(temperature=(0.0 if samples == 1 else 0.7) if temperature is None else temperature)
    rc = dataclasses.replace(base, progress=progress)
    if tts_n == 0:
        res = evaluate_at_budget(
            policy, tasks, samples=samples, rollout=dataclasses.replace(rc, act=final_act), seed=seed
        )
    else:
        tts = _tts_config(tts, tts_options)
        if tts.final_act is None:  # act greedily (one sample) unless the config says how
            tts = dataclasses.replace(tts, final_act=final_act)
        res = evaluate_at_budget(policy, tasks, samples=samples, rollout=rc, n=tts_n, mode=tts_mode, tts=tts, seed=seed)
    res.suite, res.split = suite, split
    res.summary = suite_summary(suite, res.per_task)
    return res


__all__ = ["evaluate_at_budget", "evaluate_with_tts", "run_tts", "evaluate_model"]
