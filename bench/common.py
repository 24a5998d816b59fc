"""Shared helpers of the benchmark scripts (not tests): environment, models, forced-script backend, timing, output.

Every script compares its contenders side by side in one run, on the same prompts and the same amount of work,
and reports ratios: the machine is shared (2 cores, other jobs), so absolute figures move from run to run while
ratios measured in one run are what can be compared.

Thread pools: under CPU contention OpenMP's default spin-waiting makes a 2-thread torch forward several times
slower than a 1-thread one; the scripts set ``OMP_WAIT_POLICY=PASSIVE`` (before torch is imported) unless it is
already set. It applies to every contender of a run alike.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from envace.backends.base import SamplingParams  # noqa: E402
from envace.backends.hf import HFBackend, sample_next  # noqa: E402
from envace.chat.parsing import render_act  # noqa: E402
from envace.chat.prompts import ChatFormat  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results"


def machine() -> dict[str, Any]:
    """What the figures were measured on (load average included: the machine is shared)."""
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import transformers

    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu,
        "loadavg_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def write_result(name: str, result: dict[str, Any], out_dir: str | os.PathLike | None = None) -> Path:
    out = Path(out_dir or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    result = {
        "benchmark": name,
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "machine": machine(),
        **result,
    }
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    print(f"wrote {path}")
    return path


class Timer:
    def __init__(self) -> None:
        self.s = 0.0

    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.s = time.perf_counter() - self.t0


def backend_module_at(ref: str) -> Any:
    """``envace.backends.hf`` as it was at git revision ``ref`` (a before/after baseline in the same process), with
    the ref's own versions of the modules split out of it later (sampling, kvcache) where the ref has them."""
    tag = _ident(ref)
    src = _source_at(ref, "src/envace/backends/hf.py")
    for name in ("sampling", "kvcache"):
        dep = _source_at(ref, f"src/envace/backends/{name}.py", missing_ok=True)
        if dep is not None:
            _module_from_source(f"envace.backends.{name}_at_{tag}", dep)
            src = src.replace(f"from .{name} import", f"from .{name}_at_{tag} import").replace(
                f"from . import {name}\n", f"from . import {name}_at_{tag} as {name}\n"
            )
    src = src.replace('@BACKENDS.register("hf")', "")
    inline = "def _sample(" not in src and "def _sample_rows(" not in src
    if inline:  # the oldest versions sample inline in their lockstep loop: give them the seam for scripted tokens
        call = "tok, lp = sample_next(logits, params, gen)"
        assert src.count(call) == 1 and "for _step in range(" in src, "cannot add the _sample seam to this revision"
        src = src.replace(call, "tok, lp = self._sample(logits, params, gen, active, _step)")
    mod = _module_from_source(f"envace.backends.hf_at_{tag}", src)
    if inline:
        mod.HFBackend._sample = lambda self, logits, params, gen, seqs, step: mod.sample_next(logits, params, gen)
    return mod


def update_module_at(ref: str) -> Any:
    """``envace.training.update`` as it was at git revision ``ref`` (before the subpackage layout:
    ``envace.update``)."""
    tag = _ident(ref)
    src = _source_at(ref, "src/envace/training/update.py", missing_ok=True)
    if src is None:
        return _module_from_source(f"envace.update_at_{tag}", _source_at(ref, "src/envace/update.py"))
    return _module_from_source(f"envace.training.update_at_{tag}", src)


# Where the flat modules of revisions before the subpackage layout live now, so their sources import today's.
FLAT_MODULES = {
    **dict.fromkeys(["registry", "types", "seeding", "logging", "precision", "checkpoint"], "core"),
    **dict.fromkeys(["prompts", "parsing", "openai_api"], "chat"),
    "models": "backends.models",
    "rollout": "rollout.engine",
    "variants": "rollout.variants",
    **dict.fromkeys(["algos", "stats", "prefixes"], "math"),
    "rewards": "rewards.functions",
    "reward_agreement": "evaluation.agreement",
    **dict.fromkeys(["trainer", "sft", "update", "distributed"], "training"),
    "evaluation": "evaluation.trials",
    **dict.fromkeys(["tts", "budget", "fidelity", "experiment", "report", "export"], "evaluation"),
    "serve": "serving.serve",
}


def current_layout(src: str, package: str) -> str:
    """``src``'s relative imports of flat modules (an old revision's, in ``package``) as absolute imports of where
    they live now: ``from ..types import X`` in ``envace.backends`` becomes ``from envace.core.types import X``."""

    def absolute(m: re.Match) -> str:
        dots, name, names = len(m["dots"]), m["name"], m["names"]
        base = package.split(".")[: len(package.split(".")) - (dots - 1)]
        if base != ["envace"] or name not in FLAT_MODULES:
            return m.group(0)
        where = FLAT_MODULES[name]
        return f"{m['ind']}from envace.{where if '.' in where else where + '.' + name} import {names}"

    def submodules(m: re.Match) -> str:  # ``from . import algos`` in the package root
        if package != "envace":
            return m.group(0)
        items = [n.strip() for n in m["names"].split(",")]
        return "\n".join(
            f"{m['ind']}from envace."
            f"{FLAT_MODULES[n].rsplit('.', 1)[0] if '.' in FLAT_MODULES[n] else FLAT_MODULES[n]} import "
            + (f"{FLAT_MODULES[n].rsplit('.', 1)[1]} as {n}" if "." in FLAT_MODULES[n] else n)
            if n in FLAT_MODULES
            else f"{m['ind']}from . import {n}"
            for n in items
        )

    src = re.sub(r"^(?P<ind>[ \t]*)from (?P<dots>\.+)(?P<name>\w+) import (?P<names>.+)$", absolute, src, flags=re.M)
    return re.sub(r"^(?P<ind>[ \t]*)from \. import (?P<names>[\w, ]+)$", submodules, src, flags=re.M)


def _ident(ref: str) -> str:
    """A git revision as a part of a module name ('HEAD~1' -> 'HEAD_1')."""
    return re.sub(r"\W", "_", ref)


def _source_at(ref: str, path: str, missing_ok: bool = False) -> str | None:
    """The text of ``path`` at git revision ``ref`` (None if the revision has no such file and ``missing_ok``)."""
    if (
        missing_ok
        and subprocess.run(["git", "cat-file", "-e", f"{ref}:{path}"], cwd=ROOT, capture_output=True).returncode != 0
    ):
        return None
    return subprocess.run(["git", "show", f"{ref}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def _module_from_source(name: str, src: str) -> Any:
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = name.rsplit(".", 1)[0]
    sys.modules[name] = mod
    exec(compile(current_layout(src, mod.__package__), f"<{name}>", "exec"), mod.__dict__)
    return mod


def forced_backend(base: type = HFBackend) -> type:
    """A subclass of an HF backend class whose Act (and optionally Rehearse) tokens follow a script.

    The untrained 135M model does not emit tool calls, so without a script a rehearsal rollout would have no
    Rehearse step at all. Scripted tokens still cost exactly what sampled ones do: every one is the output of
    the same batched forward (its log-prob is read off those logits); only the choice of token is scripted.
    ``act_script(session, n)`` / ``rehearse_script(session, n)`` return the text of the n-th completion of a
    session, or None to sample freely. Every call is recorded in ``calls`` (prompts, sessions, generations, seconds).
    """

    class Forced(base):  # type: ignore[misc, valid-type]
        def __init__(
            self,
            *a: Any,
            act_script: Callable[[str, int], str | None] | None = None,
            rehearse_script: Callable[[str, int], str | None] | None = None,
            **kw: Any,
        ):
            super().__init__(*a, **kw)
            self.act_script, self.rehearse_script = act_script, rehearse_script
            self.counts: dict[str, int] = {}
            self.calls: list[dict[str, Any]] = []
            self._forced_all: list[list[int] | None] | None = (
                None  # scripted tokens of the generate call running, by prompt
            )
            self._stream_forced: dict[int, list[int] | None] = {}
            self._forced: list[list[int] | None] = []
            self.end_id = ChatFormat.for_tokenizer(self.tokenizer).end_id  # the tokenizer's own end of turn

        def generate(self, prompts, params, sessions=None):
            sessions = list(sessions) if sessions is not None else [None] * len(prompts)
            role = "rehearse" if params.stop else "act"
            forced = [self._script_tokens(s, role) for s in sessions]
            self._forced_all, self._offset = forced, 0
            t0 = time.perf_counter()
            try:
                gens = super().generate(prompts, params, sessions)
            finally:
                self._forced_all = None
            self.calls.append(
                {
                    "role": role,
                    "prompts": [list(p) for p in prompts],
                    "sessions": sessions,
                    "gens": gens,
                    "seconds": time.perf_counter() - t0,
                    "forced": [f is not None for f in forced],
                }
            )
            return gens

        def _script_tokens(self, session, role):
            """The tokens of the session's next completion per its script (counted per session), or None."""
            script = self.act_script if role == "act" else self.rehearse_script
            n = self.counts.get(session, 0) if session is not None else 0
            if session is not None:
                self.counts[session] = n + 1
            text = script(session, n) if (script is not None and session is not None) else None
            return None if text is None else self.tokenizer.encode(text, add_special_tokens=False) + [self.end_id]

        def generate_stream(self, requests, on_done, seed=None):
            """Continuous batching, each finished request recorded as a call of its own."""
            t0 = time.perf_counter()

            def record(req, g):
                role = "rehearse" if (req.session or "").endswith("/rehearse") else "act"
                self.calls.append(
                    {
                        "role": role,
                        "prompts": [list(req.prompt)],
                        "sessions": [req.session],
                        "gens": [g],
                        "seconds": time.perf_counter() - t0,
                        "forced": [self._stream_forced.pop(id(req), None) is not None],
                    }
                )
                return on_done(req, g)

            self._stream_forced = {}
            return super().generate_stream(requests, record, seed)

        def _sample_rows(self, logits, rows, gen):
            """Every sampled token of this backend passes here, of generate calls (whose requests are tagged with
            their prompt's index) and streams alike."""
            tok, lp = super()._sample_rows(logits, rows, gen)
            for i, row in enumerate(rows):
                f = self._forced_all[row.req.tag] if self._forced_all is not None else self._stream_tokens(row.req)
                if f is not None:
                    t = f[min(len(row.toks), len(f) - 1)]
                    temp = row.req.params.temperature if row.req.params.temperature > 0 else 1.0
                    tok[i] = t
                    lp[i] = torch.log_softmax(logits[i].float() / temp, dim=-1)[t]
            return tok, lp

        def _stream_tokens(self, req):
            """The scripted tokens of a stream request (decided when it first samples), or None."""
            key = id(req)
            if key not in self._stream_forced:
                role = "rehearse" if (req.session or "").endswith("/rehearse") else "act"
                self._stream_forced[key] = self._script_tokens(req.session, role)
            return self._stream_forced[key]

        # -- revisions whose generate() ran its own lockstep loop (baselines of backend_module_at) -------------
        def _generate_batch(self, prompts, params, sessions, gen):
            self._forced = self._forced_all[self._offset : self._offset + len(prompts)]
            self._offset += len(prompts)
            return super()._generate_batch(prompts, params, sessions, gen)

        def _sample(self, logits, params, gen, seqs, step):
            if all(self._forced[b] is None for b in seqs):
                return sample_next(logits, params, gen)
            tok, lp = sample_next(logits, params, gen)
            temp = params.temperature if params.temperature > 0 else 1.0
            logp = torch.log_softmax(logits.float() / temp, dim=-1)
            for r, b in enumerate(seqs):
                f = self._forced[b]
                if f is not None:
                    t = f[min(step, len(f) - 1)]
                    tok[r] = t
                    lp[r] = logp[r, t]
            return tok, lp

    return Forced


def task_of_session(session: str) -> str:
    """'i0-g1:bank-train-000003/2/act' -> 'bank-train-000003' (group ids are '<prefix>:<task id>')."""
    traj = session.rsplit("/", 2)[0]
    return traj.split(":", 1)[1]


def gold_act_script(
    tasks_by_id: dict[str, Any], final_reply: str = "Done: all requested actions are complete."
) -> Callable[[str, int], str]:
    """Act follows the task's gold calls, one per step, then replies in text."""

    def script(session: str, n: int) -> str:
        gold = tasks_by_id[task_of_session(session)].flat_gold()
        return render_act([gold[n]]) if n < len(gold) else final_reply

    return script


def peak_rss_mb() -> float:
    """Peak resident memory of this process (ru_maxrss), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_json_subprocess(args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``python args...`` in a fresh process (own peak memory) and parse the last stdout line as JSON."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=os.environ.copy()
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt_ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


__all__ = [
    "SamplingParams",
    "HFBackend",
    "machine",
    "write_result",
    "Timer",
    "backend_module_at",
    "update_module_at",
    "forced_backend",
    "gold_act_script",
    "task_of_session",
    "peak_rss_mb",
    "run_json_subprocess",
    "fmt_ratio",
]
