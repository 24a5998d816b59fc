"""Rehearsal fidelity: how closely rehearsed observations match what the real environment returns.

Trajectories are rolled out in **shadow mode** (``RolloutConfig.shadow``): the policy acts on its own rehearsed
observations, and each rehearsed call is also executed in a private copy of the real environment, whose answer
is recorded next to the rehearsed one (``Step.shadow``) and never shown to the policy. The shadow environment
receives exactly the trajectory's calls in order, so the real observation is "what the world would have said
to this call after these calls". Only model-made observations are compared (sources ``rehearsed`` and
``simulator``); cache hits and code validation answers are counted (``n_cache``, ``n_validation``) but not
scored.

Per (rehearsed, real) pair, in :func:`observation_fidelity` (all in {0, 1} except ``leaf_acc``):

- ``valid``: the rehearsed output parsed as a JSON observation (a ``bad_format`` error = invalid).
- ``exact``: canonical JSON equal (:func:`envace.core.types.dumps`, sorted keys; so ``1`` and ``1.0`` differ, the
  project's rule for arguments as well).
- ``keys``: the top-level key sets are equal (both objects), or both are non-objects of the same JSON type.
- ``leaf_acc``: the fraction of the real observation's leaf paths (:func:`leaf_paths`) at which the rehearsed
  one holds a canonically equal value. Empty objects / arrays are leaves, so every observation has >= 1 leaf.
- ``outcome``: error-vs-success agreement: both are error observations, or neither is.

An invalid rehearsal reproduces nothing: it scores 0 on every metric (although a ``bad_format`` error is
formally an error observation, it is not counted as agreeing with a real error).

:func:`aggregate` averages the pairs overall, per domain (``task.env``) and per tool (``domain/tool``), and
splits them where rehearsal is known to fail (EnvSimBench: simulators are near-perfect when the state does not
change and fail when several state fields change at once), by :data:`BREAKDOWNS`:

- ``by_state``: ``read`` (the real call changed no top-level field of the environment's ``state()``) vs
  ``write`` (it changed some); the rollout records the changed fields next to each real observation
  (``Step.shadow_changed``), ``unknown`` for trajectories recorded without them;
- ``by_changed_fields``: how many top-level state fields the real call changed (``0``, ``1``, ``2``, ``3+``);
- ``by_outcome``: whether the *real* observation is a ``success`` or an ``error``;
- ``by_position``: the Act step of the trajectory the call came from (``1``, ``2``, ``3+``).

Every pair falls in exactly one bucket of each breakdown, so each breakdown's counts add up to the total.
:func:`measure_fidelity` runs the shadow rollouts and aggregates.

**Teacher-forced fidelity** (:func:`measure_teacher_forced`) scores Rehearse alone on a set of calls that does not
depend on the model: each task's gold trajectory (the gold calls, with the *real* earlier observations in Rehearse's
context, exactly the Rehearse rows supervised training uses) is answered greedily by the model and scored as above,
and, given a trainable model, the per-token negative log-likelihood of the real observation is recorded
(``nll``, ``nll_tokens``). Two models, or two checkpoints of one run, are then compared on the same calls whatever
their Act does; shadow fidelity mixes Rehearse's quality with the calls its own Act happens to make.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..backends.base import Backend
from ..rollout.engine import RolloutConfig, RolloutEngine
from ..core.types import Task, Trajectory, dumps, is_error_obs

METRICS: tuple[str, ...] = ("valid", "exact", "keys", "leaf_acc", "outcome")
"""The per-pair metrics, in report order."""
SCORED_SOURCES: tuple[str, ...] = ("rehearsed", "simulator")
"""Observation sources that a model produced, hence scored."""

Path = tuple[Any, ...]  # keys (str) and list indices (int) from the root


# --------------------------------------------------------------------------------------------------------
# Pure metrics
# --------------------------------------------------------------------------------------------------------


def leaf_paths(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Flatten a JSON value into ``{path: leaf value}``; objects by key, arrays by index. A scalar, an empty
    object and an empty array are leaves (a scalar at the root has path ``()``)."""
    if isinstance(obj, dict) and obj:
        out: dict[Path, Any] = {}
        for k, v in obj.items():
            out |= leaf_paths(v, prefix + (k,))
        return out
    if isinstance(obj, list) and obj:
        out = {}
        for i, v in enumerate(obj):
            out |= leaf_paths(v, prefix + (i,))
        return out
    return {prefix: obj}


def path_str(path: Path) -> str:
    """``("a", 0, "b")`` -> ``"a[0].b"``; the root is ``"$"``."""
    s = ""
    for p in path:
        s += f"[{p}]" if isinstance(p, int) else (f".{p}" if s else str(p))
    return s or "$"


def _same(a: Any, b: Any) -> bool:
    return dumps(a) == dumps(b)


def _json_type(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return "bool" if isinstance(x, bool) else "null"
    if isinstance(x, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(x), type(x).__name__)


def is_valid_rehearsal(obs: Any) -> bool:
    """False for the ``bad_format`` error that stands in for an unparsable rehearsed output."""
    return not (is_error_obs(obs) and obs["error"].get("kind") == "bad_format")


def mismatched_leaves(rehearsed: Any, real: Any) -> tuple[set[Path], set[Path]]:
    """(rehearsed leaf paths whose value differs from, or is absent in, the real observation; real leaf paths
    the rehearsed observation does not reproduce). Used to highlight a trajectory viewer."""
    lr, lt = leaf_paths(rehearsed), leaf_paths(real)
    bad_r = {p for p, v in lr.items() if p not in lt or not _same(v, lt[p])}
    bad_t = {p for p, v in lt.items() if p not in lr or not _same(v, lr[p])}
    return bad_r, bad_t


def leaf_accuracy(rehearsed: Any, real: Any) -> float:
    """Fraction of the real observation's leaf paths whose value the rehearsed one reproduces."""
    lt = leaf_paths(real)
    lr = leaf_paths(rehearsed)
    return sum(p in lr and _same(lr[p], v) for p, v in lt.items()) / len(lt)


def in_prompt_text(value: str | int | float, prompt: str) -> bool:
    """Whether ``value`` is in ``prompt`` as JSON text or, for a string, as bare text ("37.50" in "$37.50")."""
    return dumps(value) in prompt or (isinstance(value, str) and value in prompt)


def unshown_leaves(real: Any, rehearsed: Any, prompt: str) -> list[tuple[str, str, bool]]:
    """For each string or number leaf of the real observation that ``prompt`` (Rehearse's context) does not show
    (:func:`in_prompt_text`), so that Rehearse cannot copy it: (its key, its value as JSON, whether ``rehearsed``
    has the same value at the same path). A small number is almost always somewhere in a prompt, so the leaves
    left are conservative: what Rehearse gets right here comes from its weights (or from arithmetic)."""
    got = leaf_paths(rehearsed)
    return [
        (
            next((str(k) for k in reversed(path) if isinstance(k, str)), "$"),
            dumps(v),
            path in got and _same(got[path], v),
        )
        for path, v in leaf_paths(real).items()
        if isinstance(v, (str, int, float)) and not isinstance(v, bool) and not in_prompt_text(v, prompt)
    ]


def keys_match(rehearsed: Any, real: Any) -> bool:
    if isinstance(rehearsed, dict) and isinstance(real, dict):
        return set(rehearsed) == set(real)
    return _json_type(rehearsed) == _json_type(real)


def observation_fidelity(rehearsed: Any, real: Any) -> dict[str, float]:
    """The per-pair metrics of the module docstring, as floats in [0, 1]."""
    if not is_valid_rehearsal(rehearsed):
        return {k: 0.0 for k in METRICS}
    return {
        "valid": 1.0,
        "exact": float(_same(rehearsed, real)),
        "keys": float(keys_match(rehearsed, real)),
        "leaf_acc": leaf_accuracy(rehearsed, real),
        "outcome": float(is_error_obs(rehearsed) == is_error_obs(real)),
    }


# --------------------------------------------------------------------------------------------------------
# Pairs from shadow trajectories, and their aggregation
# --------------------------------------------------------------------------------------------------------


@dataclass
class FidelityPair:
    """One rehearsed observation next to the real one, and its scores."""

    task_id: str
    traj_id: str
    domain: str
    tool: str
    step: int
    index: int
    source: str
    rehearsed: Any
    real: Any
    scores: dict[str, float]
    changed: list[str] | None = None
    """Top-level state fields the real call changed ([]: a read; None: not recorded)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Breakdown:
    """A split of the pairs into buckets: ``bucket(pair)`` is one of ``order``."""

    doc: str
    bucket: Callable[[FidelityPair], str]
    order: tuple[str, ...]


def _capped(n: int, cap: int) -> str:
    return f"{cap}+" if n >= cap else str(n)


BREAKDOWNS: dict[str, Breakdown] = {
    "by_state": Breakdown(
        "read (no state change) vs write",
        lambda p: "unknown" if p.changed is None else ("write" if p.changed else "read"),
        ("read", "write", "unknown"),
    ),
    "by_changed_fields": Breakdown(
        "top-level state fields changed",
        lambda p: "unknown" if p.changed is None else _capped(len(p.changed), 3),
        ("0", "1", "2", "3+", "unknown"),
    ),
    "by_outcome": Breakdown(
        "real observation: success vs error",
        lambda p: "error" if is_error_obs(p.real) else "success",
        ("success", "error"),
    ),
    "by_position": Breakdown("Act step of the trajectory", lambda p: _capped(p.step + 1, 3), ("1", "2", "3+")),
}
"""The breakdowns of :func:`aggregate` (module docstring), by summary key."""


def collect_pairs(trajs: Sequence[Trajectory], tasks: Sequence[Task]) -> tuple[list[FidelityPair], dict[str, int]]:
    """All scored (rehearsed, real) pairs of shadow trajectories, and counts of what was skipped:
    ``n_cache`` / ``n_validation`` (answered without a model), ``n_no_shadow`` (no real observation recorded)."""
    env_of = {t.id: t.env for t in tasks}
    pairs: list[FidelityPair] = []
    skipped = {"n_cache": 0, "n_validation": 0, "n_no_shadow": 0}
    for tr in trajs:
        domain = env_of.get(tr.task_id, "?")
        for si, step in enumerate(tr.steps):
            for i, obs in enumerate(step.observations):
                src = step.sources[i] if i < len(step.sources) else "?"
                if src in ("cache", "validation"):
                    skipped[f"n_{src}"] += 1
                    continue
                if src not in SCORED_SOURCES:
                    continue
                real = step.shadow[i] if i < len(step.shadow) else None
                if real is None:
                    skipped["n_no_shadow"] += 1
                    continue
                tool = step.calls[i].name if i < len(step.calls) else "?"
                changed = step.shadow_changed[i] if i < len(step.shadow_changed) else None
                pairs.append(
                    FidelityPair(
                        tr.task_id, tr.id, domain, tool, si, i, src, obs, real, observation_fidelity(obs, real), changed
                    )
                )
    return pairs, skipped


def mean_scores(pairs: Sequence[FidelityPair]) -> dict[str, float]:
    """``{"n": count, metric: mean}``; the metrics are 0 when there is no pair."""
    n = len(pairs)
    return {"n": float(n), **{k: (sum(p.scores[k] for p in pairs) / n if n else 0.0) for k in METRICS}}


def aggregate(pairs: Sequence[FidelityPair]) -> dict[str, Any]:
    """``{"overall": scores, "by_domain": {domain: scores}, "by_tool": {"domain/tool": scores}}``, one
    ``{bucket: scores}`` per :data:`BREAKDOWNS` entry (buckets in their order, empty ones left out) and
    ``pair_scores`` (``{metric: [score of each pair]}``, in pair order: intervals over observations,
    envace.evaluation.claims)."""
    by_domain: dict[str, list[FidelityPair]] = {}
    by_tool: dict[str, list[FidelityPair]] = {}
    for p in pairs:
        by_domain.setdefault(p.domain, []).append(p)
        by_tool.setdefault(f"{p.domain}/{p.tool}", []).append(p)
    out: dict[str, Any] = {
        "overall": mean_scores(pairs),
        "by_domain": {k: mean_scores(v) for k, v in sorted(by_domain.items())},
        "by_tool": {k: mean_scores(v) for k, v in sorted(by_tool.items())},
    }
    for key, bd in BREAKDOWNS.items():
        buckets: dict[str, list[FidelityPair]] = {b: [] for b in bd.order}
        for p in pairs:
            buckets[bd.bucket(p)].append(p)
        out[key] = {b: mean_scores(v) for b, v in buckets.items() if v}
    out["pair_scores"] = {k: [float(p.scores[k]) for p in pairs] for k in METRICS}
    return out


@dataclass
class FidelityResult:
    summary: dict[str, Any]
    """:func:`aggregate` of the pairs, plus ``skipped`` counts."""
    pairs: list[FidelityPair] = field(default_factory=list)
    trajectories: list[Trajectory] = field(default_factory=list)

    def table(self) -> str:
        return format_fidelity(self.summary)

    def to_dict(self, with_trajectories: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {"summary": self.summary, "pairs": [p.to_dict() for p in self.pairs]}
        if with_trajectories:
            d["trajectories"] = [t.to_dict(with_rows=False) for t in self.trajectories]
        return d


def summary_bucket(summary: dict[str, Any], group: str, bucket: str | None = None) -> dict[str, Any] | None:
    """One bucket of a fidelity summary: ``summary[group]`` (``bucket`` None, e.g. ``"overall"``) or
    ``summary[group][bucket]`` (e.g. ``"by_state"``, ``"read"``); None where the summary has none."""
    return summary.get(group) if bucket is None else summary.get(group, {}).get(bucket)


def exact_cell(bucket: dict[str, Any] | None) -> str:
    """A table cell for a bucket's exact-match rate with its 95% Wilson interval over observations,
    ``"0.21 [0.14, 0.31] (n=90)"``; ``"-"`` for a missing or empty bucket."""
    from ..math.stats import wilson_interval

    if not bucket or not bucket["n"]:
        return "-"
    n = int(bucket["n"])
    lo, hi = wilson_interval(round(bucket["exact"] * n), n)
    return f"{bucket['exact']:.2f} [{lo:.2f}, {hi:.2f}] (n={n})"


def format_fidelity(summary: dict[str, Any]) -> str:
    """A text table: overall, then one line per domain and per tool, then the breakdowns (read / write, state
    fields changed, real success / error, position)."""
    head = f"{'':<32} {'n':>5} " + " ".join(f"{k:>8}" for k in METRICS)
    lines = [head]

    def line(name: str, s: dict[str, float]) -> str:
        return f"{name[:32]:<32} {int(s['n']):>5} " + " ".join(f"{s[k]:>8.3f}" for k in METRICS)

    lines.append(line("overall", summary["overall"]))
    for group in ("by_domain", "by_tool"):
        for name, s in summary.get(group, {}).items():
            lines.append(line(("  " if group == "by_tool" else "") + name, s))
    for key, bd in BREAKDOWNS.items():
        if summary.get(key):
            lines.append(f"{bd.doc}:")
            lines += [line(f"  {key[3:]}={name}", s) for name, s in summary[key].items()]
    if summary.get("skipped"):
        lines.append("skipped: " + ", ".join(f"{k}={v}" for k, v in summary["skipped"].items()))
    return "\n".join(lines)


def measure_fidelity(
    policy: Backend,
    tasks: list[Task],
    rollout_cfg: RolloutConfig | None = None,
    rehearser: Backend | None = None,
    simulator: Backend | None = None,
    *,
    mode: str | None = None,
    group_size: int | None = None,
    seed: int | None = None,
) -> FidelityResult:
    """Roll out ``tasks`` in shadow mode (``mode``: rehearsal, per_role with ``rehearser`` or simulator with
    ``simulator``; ``group_size`` trajectories each, sampled from ``seed``; None: the deprecated fields of
    ``rollout_cfg``) and score every rehearsed observation against the real one. Nothing real is shown to the
    policy."""
    cfg = rollout_cfg or RolloutConfig()
    mode = cfg.mode if mode is None else mode
    if mode == "real":
        raise ValueError("fidelity needs rehearsed observations: use mode rehearsal, per_role or simulator, not real")
    engine = RolloutEngine(policy, cfg, rehearser=rehearser, simulator=simulator, mode=mode, shadow=True)
    trajs = engine.run(tasks, group_prefix="fid", group_size=group_size, seed=seed)
    pairs, skipped = collect_pairs(trajs, tasks)
    summary = aggregate(pairs)
    summary["skipped"] = skipped
    return FidelityResult(summary, pairs, trajs)


TEACHER_FORCED_SOURCE = "teacher_forced"
"""The ``source`` of a pair from :func:`measure_teacher_forced`."""


def teacher_forced_pairs(
    trajs: Sequence[Trajectory], tasks: Sequence[Task], answers: Sequence[Any]
) -> list[FidelityPair]:
    """The pairs of gold trajectories' Rehearse rows, in order (row k of a trajectory answers its k-th rehearsed
    call), with ``answers`` the model's observations for those rows in the same flat order."""
    env_of = {t.id: t.env for t in tasks}
    calls = [
        (tr, si, step, i)
        for tr in trajs
        for si, step in enumerate(tr.steps)
        for i, src in enumerate(step.sources)
        if src == "rehearsed"
    ]
    if len(calls) != len(answers):
        raise ValueError(f"{len(answers)} answers for {len(calls)} rehearsed calls of the gold trajectories")
    pairs: list[FidelityPair] = []
    for (tr, si, step, i), obs in zip(calls, answers):
        real = step.observations[i]  # the gold trajectory's observations are the real ones
        changed = step.shadow_changed[i] if i < len(step.shadow_changed) else None
        pairs.append(
            FidelityPair(
                tr.task_id,
                tr.id,
                env_of.get(tr.task_id, "?"),
                step.calls[i].name,
                si,
                i,
                TEACHER_FORCED_SOURCE,
                obs,
                real,
                observation_fidelity(obs, real),
                changed,
            )
        )
    return pairs


def mean_nll(pairs: Sequence[FidelityPair]) -> float | None:
    """Token-weighted mean negative log-likelihood of the real observations (None without NLL scores)."""
    tokens = sum(p.scores.get("nll_tokens", 0.0) for p in pairs)
    if not tokens:
        return None
    return sum(p.scores["nll"] * p.scores["nll_tokens"] for p in pairs) / tokens


def aggregate_nll(pairs: Sequence[FidelityPair]) -> dict[str, Any]:
    """:func:`mean_nll` overall and per bucket of each :data:`BREAKDOWNS` entry (empty buckets left out)."""
    out: dict[str, Any] = {"overall": mean_nll(pairs)}
    for key, bd in BREAKDOWNS.items():
        out[key] = {b: mean_nll([p for p in pairs if bd.bucket(p) == b]) for b in bd.order}
        out[key] = {b: v for b, v in out[key].items() if v is not None}
    return out


def gold_rehearse_rows(
    tokenizer: Any, tasks: list[Task], chat_format: str | None = None, tool_format: str | None = None
) -> tuple[list[Trajectory], list[Any]]:
    """The tasks' gold trajectories (shadow-recorded: which state fields each real call changed) and their Rehearse
    rows in order: the fixed calls :func:`measure_teacher_forced` scores."""
    from ..training.sft import gold_trajectories

    trajs = gold_trajectories(tokenizer, tasks, chat_format=chat_format, tool_format=tool_format, shadow=True)
    return trajs, [r for t in trajs for r in t.rows if r.role == "rehearse"]


def measure_teacher_forced(
    policy: Backend,
    tokenizer: Any,
    tasks: list[Task],
    model: Any = None,
    bf16: bool = False,
    max_new_tokens: int = 160,
    chat_format: str | None = None,
    tool_format: str | None = None,
) -> FidelityResult:
    """Teacher-forced Rehearse fidelity (module docstring): every Rehearse row of the tasks' gold trajectories
    answered greedily by ``policy`` and scored against the real observation; with ``model`` (the same weights as
    a torch model) each pair also gets ``nll`` (mean over the real observation's tokens, its closing token
    included) and ``nll_tokens``, and the summary an ``nll`` block (:func:`aggregate_nll`)."""
    from ..backends.base import SamplingParams
    from ..chat.parsing import OBS_CLOSE, parse_observation

    trajs, rows = gold_rehearse_rows(tokenizer, tasks, chat_format, tool_format)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop=[OBS_CLOSE])
    gens = policy.generate([r.prompt_ids for r in rows], params) if rows else []
    pairs = teacher_forced_pairs(trajs, tasks, [parse_observation(g.text)[0] for g in gens])
    if model is not None and rows:
        from ..training.update import recompute_old_logprobs

        scored = [dataclasses.replace(r, old_logprobs=[0.0] * len(r.completion_ids)) for r in rows]
        recompute_old_logprobs(model, scored, micro_batch_tokens=4096, temperatures={}, bf16=bf16)
        for p, r in zip(pairs, scored):
            p.scores["nll"] = -sum(r.old_logprobs) / len(r.old_logprobs)
            p.scores["nll_tokens"] = float(len(r.old_logprobs))
    summary = aggregate(pairs)
    summary["skipped"] = {"n_cache": 0, "n_validation": 0, "n_no_shadow": 0}
    if model is not None:
        summary["nll"] = aggregate_nll(pairs)
    return FidelityResult(summary, pairs, trajs)


__all__ = [
    "TEACHER_FORCED_SOURCE",
    "teacher_forced_pairs",
    "mean_nll",
    "aggregate_nll",
    "gold_rehearse_rows",
    "measure_teacher_forced",
    "METRICS",
    "leaf_paths",
    "path_str",
    "is_valid_rehearsal",
    "mismatched_leaves",
    "leaf_accuracy",
    "in_prompt_text",
    "unshown_leaves",
    "keys_match",
    "observation_fidelity",
    "FidelityPair",
    "Breakdown",
    "BREAKDOWNS",
    "collect_pairs",
    "mean_scores",
    "aggregate",
    "FidelityResult",
    "format_fidelity",
    "summary_bucket",
    "exact_cell",
    "measure_fidelity",
]
