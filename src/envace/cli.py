"""The ``envace`` command line.

    envace --version                 prints `envace <version>`
    envace demo                      SFT warm-up -> EnvACE training -> before/after evaluation (embedded defaults)
    envace sft   [--config F] [--set key=value ...]
    envace train [--config F] [--set key=value ...]     e.g. --set variant=real_env --set group_size=4
    envace eval  --model M --suite S [--split test] [-n 20] [--samples K] [--tts-n N --tts-mode parallel|sequential]
                 [--backend hf|http|vllm] [--out F]
    envace compare A.json B.json [--json]   paired comparison of two saved eval results on the same tasks
    envace fidelity --model M --suite S [-n 8] [-k 2] [--mode rehearsal|per_role|simulator] [--backend hf|http|vllm]
                    [--out F]
    envace experiment [--config F] [--set key=value ...]  all arms x seeds x budgets -> report.md / report.html
    envace rollout --model M --suite S --mode rehearsal -n 2 -k 4 --out trajs.jsonl
    envace tasks --suite S [--split test] [-n 3]   (--list: the suites, built-in and plug-ins)
    envace export FILE... [--real-only] [--target hf|openai] [--gold --suite S --split train -n 100] --out records.jsonl
                                     OpenAI / HF chat records
    envace rehearse --model M --suite S [--index 0] [-N 2] [--mode parallel|sequential] [--memory lessons|calls|...]
    envace serve --model M [--served-model-name N] [--host 127.0.0.1] [--port 8000]   OpenAI-compatible server

sft, train, eval, fidelity, experiment, rollout, rehearse, serve and export are each configured by one typed dataclass
(TrainConfig, SFTConfig, EvalConfig, FidelityConfig, ExperimentConfig, RolloutBatchConfig, RehearseConfig,
ServeConfig, ExportConfig) and take ``--config F.yaml``, ``--set key=value`` (repeatable, dotted for nested fields) and
``--print-config`` (print the resolved config as YAML and exit). Their other flags are shorthands of fields, listed
by name in :data:`FLAGS` (``-n 20`` is ``--set n=20``). Precedence: dataclass defaults < the file < shorthand flags
< ``--set``. ``--help`` lists every field with its default and docstring. ``--backend http`` evaluates a served
model: ``--model`` is then the server's http(s)://host:port/v1 URL. The demo itself lives in envace.evaluation.demo.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import yaml

from . import __version__
from .backends.loaders import LOADERS
from .core.atomic import write_json
from .evaluation.demo import DEMO_FIDELITY_TASKS, DEMO_REWARD, DEMO_SUITE, HEADROOM_KINDS, run_demo
from .evaluation.agreement import spec_label

# Moved to envace.evaluation.demo (issue 30); importable from here for one more version, for scripts written before.
from .evaluation.demo import (  # noqa: F401
    DEMO_CONTROLS,
    FIDELITY_CELLS,
    demo_rollout as _demo_rollout,
    demo_sft_config,
    demo_train_config,
    fidelity_table,
    finished_warmup,
)


MODEL_HELP = (
    "model name, model folder, or training checkpoint / run folder "
    "(full fine-tuning or LoRA: a LoRA adapter is merged into its base)"
)
SERVED_MODEL_HELP = MODEL_HELP + "; with --backend http the server's URL"


def cmd_sft(cfg: Any) -> int:
    from .training.sft import sft

    res = sft(cfg)
    last = res.metrics[-1] if res.metrics else {}
    print(
        f"SFT done: {len(res.metrics)} steps, final nll "
        f"{last.get('sft/nll', float('nan')):.3f}; checkpoint: {res.checkpoint}"
    )
    return 0


def cmd_train(cfg: Any) -> int:
    from .training.trainer import train

    res = train(cfg)
    print(
        f"training done at step {res.step}; checkpoint: {res.checkpoint}; "
        f"metrics: {os.path.join(res.out_dir, 'metrics.jsonl')}"
    )
    return 0


def _reward_spec(text: str) -> Any:
    """A ``--reward`` value: a YAML mapping ``{name: weight}`` when it is one, else the spec text itself."""
    return yaml.safe_load(text) if text.lstrip().startswith("{") else text


def cmd_eval(cfg: Any) -> int:
    from .config import to_dict
    from .evaluation.budget import evaluate_model
    from .evaluation.trials import save_result
    from .evaluation.tts import TTSConfig, save_records

    check_outputs({"--out": cfg.out, "--tts-records": cfg.tts_records})  # before the evaluation, not after it
    res = evaluate_model(
        cfg.model,
        cfg.suite,
        cfg.split,
        cfg.n,
        cfg.samples,
        cfg.seed,
        tts_n=cfg.tts_n,
        tts_mode=cfg.tts_mode,
        rollout=cfg.rollout,
        temperature=cfg.temperature,
        tts=TTSConfig(memory=cfg.tts_memory),
        bf16=cfg.bf16,
        backend=cfg.backend,
        backend_options=cfg.backend_options,
    )
    print(
        f"{cfg.model} on {cfg.suite}/{cfg.split}: {len(res.per_task)} "
        f"tasks x {cfg.samples} real trials, rehearsal budget N={cfg.tts_n}"
        + (f" ({cfg.tts_mode})" if cfg.tts_n else "")
    )
    print(res.table())
    if cfg.out:
        save_result(res, cfg.out, config=to_dict(cfg), with_trajectories=cfg.trajectories)
        print(f"wrote {cfg.out}")
    if cfg.tts_records and getattr(res, "records", None):
        save_records(cfg.tts_records, res.records, with_rows=False)
        print(f"wrote {len(res.records)} rehearsal records to {cfg.tts_records}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of two saved ``envace eval --out`` results: refused unless suite, split and tasks match."""
    from .evaluation.trials import compare_results, format_comparison, load_result

    for path in (args.a, args.b):
        check_input_file(path, "a saved evaluation result (a JSON file written by envace eval --out)")
    c = compare_results(
        load_result(args.a), load_result(args.b), names=(args.a, args.b), resamples=args.resamples, seed=args.seed
    )
    print(json.dumps(c, indent=1) if args.json else format_comparison(c))
    return 0


def _helpers(cfg: Any) -> dict[str, Any]:
    """The RolloutEngine keywords of ``cfg.mode`` (envace.rollout.modes.MODES): the model that answers Act's calls
    besides the policy, frozen, named by the config field of the same name (``cfg.rehearser``, ``cfg.simulator``),
    by default ``cfg.model`` (a checkpoint's own ``rehearser/`` for per_role); {} for rehearsal and real."""
    from .backends.loaders import frozen_backend
    from .rollout.modes import MODES

    return MODES.get(cfg.mode).helpers(lambda helper, role: frozen_backend(getattr(cfg, helper) or cfg.model, role))


def cmd_fidelity(cfg: Any) -> int:
    from .backends.loaders import open_backend
    from .envs import load_tasks
    from .evaluation.fidelity import measure_fidelity
    from .rollout.engine import format_trajectory

    check_outputs({"--out": cfg.out})
    tasks = load_tasks(cfg.suite, cfg.split, n=cfg.n, seed=cfg.seed)  # a bad suite fails before a model loads
    policy = open_backend(cfg.model, cfg.backend, cfg.backend_options)
    extra = _helpers(cfg)
    res = measure_fidelity(policy, tasks, cfg.rollout, **extra, mode=cfg.mode, group_size=cfg.k, seed=cfg.seed)
    for t in res.trajectories[: cfg.show]:
        print(format_trajectory(t) + "\n")
    print(f"rehearsal fidelity of {cfg.model} ({cfg.mode}) on {len(tasks)} {cfg.suite}/{cfg.split} tasks x {cfg.k}:")
    print(res.table())
    if cfg.out:
        write_json(cfg.out, res.to_dict(with_trajectories=True), default=str)  # its folder made if needed
        print(f"wrote {cfg.out}")
    return 0


def cmd_experiment(cfg: Any) -> int:
    from .evaluation.experiment import run_experiment

    res = run_experiment(cfg)
    print(f"report: {res.report['html']} (and report.md, trajectories.html, results.json in {res.out_dir})")
    return 0


def cmd_rollout(cfg: Any) -> int:
    from .backends.loaders import open_backend
    from .envs import load_tasks
    from .rollout.engine import RolloutEngine, format_trajectory
    from .core.types import write_jsonl

    check_outputs({"--out": cfg.out})
    tasks = load_tasks(cfg.suite, cfg.split, n=cfg.n, seed=cfg.seed)  # a bad suite fails before a model loads
    policy = open_backend(cfg.model, cfg.backend, cfg.backend_options)
    t0 = time.perf_counter()
    engine = RolloutEngine(policy, cfg.rollout, **_helpers(cfg), mode=cfg.mode, shadow=cfg.shadow)
    trajs = engine.run(tasks, group_size=cfg.k, seed=cfg.seed)
    dt = time.perf_counter() - t0
    if os.path.exists(cfg.out):
        os.remove(cfg.out)
    write_jsonl(cfg.out, trajs)
    for t in trajs[: cfg.show]:
        print(format_trajectory(t))
        print()
    n_tok = sum(len(r.completion_ids) for t in trajs for r in t.rows)
    print(f"{len(trajs)} trajectories, {n_tok} generated tokens in {dt:.1f}s ({n_tok / dt:.1f} tok/s); wrote {cfg.out}")
    return 0


def cmd_export(cfg: Any) -> int:
    """Trajectory files (and / or a suite's gold trajectories) as OpenAI / HF chat records in JSON lines. A malformed
    item is one line on stderr naming its file and line; the valid ones are written all the same. No record at all
    (``--real-only`` on a rehearsed run, say) is an error line and no file."""
    from .evaluation.export import export_records, read_trajectories, write_records

    if not cfg.inputs and not cfg.gold:
        raise ValueError("nothing to export: give trajectory files or --gold")
    read = read_trajectories(cfg.inputs)
    style = dict(content=cfg.content, system=cfg.system, target=cfg.target)
    records, errors, imagined = export_records(read.items, cfg.real_only, **style)
    errors = read.errors + errors
    if cfg.gold:
        from .envs import load_tasks
        from .backends.models import load_tokenizer
        from .training.sft import gold_trajectories

        gold = gold_trajectories(load_tokenizer(cfg.model), load_tasks(cfg.suite, cfg.split, n=cfg.n, seed=cfg.seed))
        more, gold_errors, _ = export_records([(t, {}) for t in gold], world="real", **style)
        records, errors = records + more, errors + gold_errors
    for line in errors[:20]:
        print(f"envace export: skipped {line}", file=sys.stderr)
    if len(errors) > 20:
        print(f"envace export: ... and {len(errors) - 20} more skipped", file=sys.stderr)
    if not records:  # an empty file is no dataset (``datasets`` cannot read it): say why instead
        raise ValueError(nothing_exported(len(read.items), imagined, len(errors), cfg.out))
    write_records(cfg.out, records)
    skipped = f"; skipped {len(errors)} malformed" + (f", {imagined} imagined (real_only)" if cfg.real_only else "")
    print(
        f"wrote {len(records)} records to {cfg.out}"
        + (f" ({len(read.items)} trajectories read{skipped})" if cfg.inputs else "")
    )
    return 0


def nothing_exported(read: int, imagined: int, malformed: int, out: str) -> str:
    """Why an export has no record, in one line (``out`` is left as it was)."""
    why = (
        f"nothing real found: {imagined} of the {read} trajectories read were imagined (rehearsed or simulated) and "
        "--real-only keeps only mode 'real'"
        if imagined
        else f"no records: {read} trajectories read"
    )
    return why + (f", {malformed} skipped as malformed" if malformed else "") + f"; {out} not written"


def cmd_rehearse(cfg: Any) -> int:
    """Test-time scaling on one task: N private attempts + reflections -> memory -> one real execution."""
    from .backends.base import SamplingParams
    from .backends.loaders import open_backend
    from .envs import task_at
    from .evaluation.budget import run_tts
    from .evaluation.tts import TTSConfig, format_record

    task = task_at(cfg.suite, cfg.split, cfg.index)  # the suite's own order; past its end: an error before the model
    policy = open_backend(cfg.model, cfg.backend, cfg.backend_options)
    gen = cfg.rollout.act  # the attempts' Act; reflections sample it at T=0.7, the real run greedily
    tts = TTSConfig(
        n=cfg.n,
        mode=cfg.mode,
        memory=cfg.memory,
        memory_max_tokens=cfg.memory_max_tokens,
        reflect_sampling=gen.with_(temperature=0.7),
        memory_sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.memory_max_tokens),
        rollout=cfg.rollout,
        seed=cfg.seed,
        final_act=gen.with_(temperature=0.0),
    )
    rec = run_tts(policy, [task], tts)[0]
    print(format_record(rec))
    if cfg.out:
        write_json(cfg.out, rec.to_dict(), ensure_ascii=False, indent=None)
        print(f"wrote {cfg.out}")
    return 0


def cmd_serve(cfg: Any) -> int:
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models, /health) over a backend."""
    from .serving.serve import serve

    check_listen(cfg.host, cfg.port)  # a port in use or a bad host fails before the model loads
    serve(cfg)
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    from .envs import load_tasks, registered_suites

    if args.list:
        suites = registered_suites()
        width = max(map(len, suites))
        for name, origin in suites.items():
            print(f"{name:<{width}}  {origin}")
        return 0
    for t in load_tasks(args.suite, args.split, n=args.n, seed=args.seed):
        print(json.dumps(t.to_dict(), indent=1, ensure_ascii=False))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The demo's stages, tables and files: :func:`envace.evaluation.demo.run_demo`."""
    return run_demo(args)


def check_outputs(paths: dict[str, str | None]) -> None:
    """Raise ``ValueError`` naming the option unless a file can be written at each given path (None: not asked for),
    so that a bad ``--out`` fails before the work whose result it would hold (envace.core.paths)."""
    from .core.paths import check_writable_file

    for option, path in paths.items():
        if path:
            check_writable_file(path, option)


def check_input_file(path: str, what: str) -> None:
    """Raise ``ValueError`` unless ``path`` is a file (a missing path or a folder is named, with what was expected)."""
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a folder, not {what}")
    if not os.path.isfile(path):
        raise ValueError(f"{path!r}: no such file; expected {what}")


def check_listen(host: str, port: int) -> None:
    """Raise ``ValueError`` unless a server can listen on (host, port): bound and closed at once, with the options of
    envace.serving.serve.EnvaceServer.bind (port 0: any free one, always possible)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except (OSError, OverflowError) as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e}") from None


def _resumes_from(unit: str) -> Any:
    """Where an interrupted ``envace train`` or ``sft`` resumes: its latest checkpoint, if it saved one (one every
    ``save_every`` ``unit``)."""

    def line(cfg: Any) -> str:
        from .core.checkpoint import latest_checkpoint, load_state

        ckpt = latest_checkpoint(os.path.join(cfg.out_dir, "checkpoints"))
        if ckpt is None:
            return (
                f"no checkpoint in {cfg.out_dir} yet (one every save_every={cfg.save_every} {unit}); "
                "the same command starts the run over"
            )
        return f"the same command resumes it from step {load_state(ckpt)['step']} ({ckpt})"

    return line


# command -> fn(its config or parsed arguments) -> what the one line after Ctrl-C says besides "interrupted"
INTERRUPTED: dict[str, Any] = {
    "train": _resumes_from("iterations"),
    "eval": lambda cfg: "no result was written (an evaluation does not resume); run it again",
    "sft": _resumes_from("steps"),
    "experiment": lambda cfg: (
        f"the same command resumes it in {cfg.out_dir}: finished evaluations are kept, training resumes from its "
        "checkpoints"
        if cfg.resume
        else f"resume=false: the same command starts over in {cfg.out_dir}; resume=true keeps what it finished"
    ),
    "demo": lambda args: f"the same command into --out {args.out} reuses the stages it finished",
}


def interrupted_line(cmd: str, cfg: Any) -> str:
    """The one line an interrupted command ends with: ``envace <cmd>: interrupted`` and, where the command knows,
    where it can resume (:data:`INTERRUPTED`; ``cfg`` None: interrupted before its config was made)."""
    note = INTERRUPTED.get(cmd)
    return f"envace {cmd}: interrupted" + (f"; {note(cfg)}" if note and cfg is not None else "")


def error_line(cmd: str, e: BaseException) -> str:
    """``envace <cmd>: error: <message>`` on one line (an OSError as its reason and file name)."""
    if isinstance(e, OSError) and e.strerror:
        text = f"{e.strerror}: {e.filename!r}" if e.filename else e.strerror
    else:
        text = str(e)
    return f"envace {cmd}: error: " + " ".join(text.splitlines())


def _bf16_arg(value: str) -> bool | str:
    from .core.precision import bf16_setting

    try:
        return bf16_setting(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None


# --bf16 (on), --bf16 auto|on|off; absent: the config's value (float32 by default). "on" where bf16 is slow is honoured
# with a warning
_BF16_ARG: dict[str, Any] = dict(nargs="?", const=True, type=_bf16_arg, metavar="auto|on|off")

_CONTROL = {
    "cmd",
    "fn",
    "config",
    "overrides",
    "print_config",
    "config_class",
}  # parsed arguments that are no config field


def config_class(path: str) -> type:
    """The config dataclass that ``"module:Class"`` names (imported on use: only the command that runs needs it)."""
    import importlib

    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


class _Parser(argparse.ArgumentParser):
    """A parser whose command may be configured by a dataclass (``config="module:Class"``): its shorthand flags
    (:data:`FLAGS`) are added when the command is parsed or its usage shown, and its ``--help`` ends with the
    dataclass's fields, their defaults and docstrings (envace.config.config_help), built only when shown. So only
    the command that runs imports its config's module (the flags take their types from its fields)."""

    def __init__(self, *args: Any, config: str | None = None, command: str | None = None, **kw: Any):
        self.config = config
        self.command = command
        self.flags_added = False
        if config:
            kw.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kw)

    def add_config_flags(self) -> None:
        """Add this command's shorthand flags (:data:`FLAGS`), once."""
        if self.config and not self.flags_added:
            self.flags_added = True
            if self.command in FLAGS:
                _add_flags(self, self.command, config_class(self.config))

    def parse_known_args(self, *args: Any, **kw: Any) -> Any:
        self.add_config_flags()
        return super().parse_known_args(*args, **kw)

    def format_usage(self) -> str:
        self.add_config_flags()
        return super().format_usage()

    def format_help(self) -> str:
        self.add_config_flags()
        if self.config and self.epilog is None:
            from .config import config_help

            self.epilog = config_help(config_class(self.config))
        return super().format_help()


def _config_command(sub: Any, name: str, config: str, fn: Any, help: str) -> argparse.ArgumentParser:  # noqa: A002
    """A command configured by the dataclass ``config``: ``--config``, ``--set``, ``--print-config`` and, when it is
    parsed, its shorthand flags (:data:`FLAGS`)."""
    p = sub.add_parser(name, help=help, config=config, command=name)
    p.add_argument("--config", metavar="F.yaml", help="YAML file of config fields (listed below)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (dotted for nested: rollout.max_steps=6; "
        "repeatable); wins over the file and the flags",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.set_defaults(fn=fn, config_class=config)
    return p


BACKEND_CHOICES = "|".join(LOADERS.names())  # what --backend takes: envace.backends.loaders.LOADERS
MEMORIES = "lessons|calls|model|concat"
FLAGS: dict[str, str] = {
    "eval": "model backend suite split n samples tts_n tts_mode tts_memory tts_records temperature max_steps"
    " max_new_tokens seed bf16 out trajectories",
    "fidelity": "model backend suite split n k mode rehearser simulator validate_in_code reference_cache max_steps"
    " max_new_tokens seed show out",
    "rollout": "model backend suite split mode simulator rehearser n k max_steps max_new_tokens shadow seed show out",
    "export": "gold suite split n seed model real_only target content system out",
    "rehearse": "model backend suite split index n mode memory memory_max_tokens "
    "max_steps max_new_tokens temperature seed out",
    "serve": "model served_model_name host port backend device bf16 max_batch batch_wait_ms stream_segment_tokens"
    " default_max_tokens max_tokens_limit verbose",
}
"""Configured command -> the fields of its config that have a flag of their own, in ``--help``'s order. Each flag is
``--set FIELD=VALUE`` in short, spelled from its field (``--max-new-tokens`` for max_new_tokens, ``-n`` for n) and
parsed by its field's type (:data:`FLAG_KINDS`); :data:`FLAG_EXTRAS` lists what else a few of them have. A new
shorthand is a field name here, not a new argument. A name of the config's ``FLAT_ROLLOUT`` (``max_steps``,
``max_new_tokens``, ...: envace.config.FLAT_ROLLOUT_KEYS) is the shorthand of the nested fields it sets
(``--max-new-tokens`` is ``--set rollout.act.max_new_tokens=... --set rollout.rehearse.max_new_tokens=...``)."""

FLAG_EXTRAS: dict[str, dict[str, Any]] = {
    "eval.model": dict(help=SERVED_MODEL_HELP),
    "eval.backend": dict(metavar=BACKEND_CHOICES),
    "eval.samples": dict(flags=("--samples", "-k")),
    "eval.tts_mode": dict(metavar="parallel|sequential"),
    "eval.tts_memory": dict(metavar=MEMORIES),
    "eval.tts_records": dict(metavar="FILE.jsonl"),
    "fidelity.model": dict(help=SERVED_MODEL_HELP),
    "fidelity.backend": dict(metavar=BACKEND_CHOICES),
    "fidelity.mode": dict(metavar="rehearsal|per_role|simulator"),
    "rollout.model": dict(help=SERVED_MODEL_HELP),
    "rollout.backend": dict(metavar=BACKEND_CHOICES),
    "export.model": dict(help="model whose tokenizer renders the gold rollouts"),
    "export.target": dict(
        metavar="hf|openai", help="same as --set target=...: hf (chat templates, TRL) or openai (fine-tuning API)"
    ),
    "export.content": dict(metavar="text|raw"),
    "export.system": dict(metavar="seen|task"),
    "rehearse.model": dict(help=SERVED_MODEL_HELP),
    "rehearse.backend": dict(metavar=BACKEND_CHOICES),
    "rehearse.n": dict(flags=("-N",)),
    "rehearse.mode": dict(metavar="parallel|sequential"),
    "rehearse.memory": dict(metavar=MEMORIES),
    "serve.model": dict(help=MODEL_HELP),
}
"""``"command.field"`` -> what its flag has besides the rule of :data:`FLAGS`: other spellings (``flags``, the
spelled one included if it stays), the choices it shows (``metavar``), a ``help`` that says more than the default."""

FLAG_KINDS: dict[str, dict[str, Any]] = {
    "str": {},
    "str | None": {},
    "int": dict(type=int),
    "int | None": dict(type=int),
    "float": dict(type=float),
    "float | None": dict(type=float),
    "bool": dict(action="store_true"),
    "bool | str": _BF16_ARG,  # the bf16 settings: true, false or auto
}
"""A field's type annotation (as written in its dataclass) -> how its flag parses a value."""


def flag_names(field: str) -> tuple[str, ...]:
    """The flag spelled from ``field``: ``-n`` for a one-letter field, else ``--max-new-tokens`` for max_new_tokens."""
    return (f"-{field}",) if len(field) == 1 else ("--" + field.replace("_", "-"),)


def _add_flags(p: argparse.ArgumentParser, command: str, cls: type) -> None:
    """The shorthand flags of ``command`` (:data:`FLAGS`), each absent unless given, so that the config file's value
    stands. A table entry that is no field of ``cls``, or a field type no flag parses, raises ``ValueError`` (when the
    command is parsed: tests/test_cli_configs.py parses each)."""
    import dataclasses

    from .config import FLAT_ROLLOUT_KEYS

    types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    flat = getattr(cls, "FLAT_ROLLOUT", ())
    sets = {k: [k] for k in types} | {k: [f"rollout.{p}" for p in FLAT_ROLLOUT_KEYS[k]] for k in flat if k not in types}
    types |= {k: _nested_type(cls, sets[k][0]) for k in flat if k not in types}
    for field in FLAGS.get(command, "").split():
        if field not in types:
            raise ValueError(
                f"FLAGS[{command!r}]: {cls.__name__} has no field {field!r}; fields: {', '.join(types)}"
                + (f" (rollout shorthands: {', '.join(flat)})" if flat else "")
            )
        if types[field] not in FLAG_KINDS:
            raise ValueError(
                f"{cls.__name__}.{field}: no flag parses a {types[field]!r}; valid: {', '.join(FLAG_KINDS)}"
            )
        kw = {**FLAG_KINDS[types[field]], **FLAG_EXTRAS.get(f"{command}.{field}", {})}
        names = kw.pop("flags", flag_names(field))
        value = "true" if kw.get("action") == "store_true" else "..."
        kw.setdefault("help", "same as " + " ".join(f"--set {name}={value}" for name in sets[field]))
        p.add_argument(*names, dest=field, default=argparse.SUPPRESS, **kw)


def _nested_type(cls: type, path: str) -> str:
    """The type annotation (as written) of the dotted field ``path`` of the config dataclass ``cls``."""
    import dataclasses
    import typing

    head, _, rest = path.partition(".")
    if not rest:
        return str(next(f.type for f in dataclasses.fields(cls) if f.name == head))
    return _nested_type(typing.get_type_hints(cls)[head], rest)


def command_config(args: argparse.Namespace) -> Any:
    """The config of a configured command: defaults < ``--config`` file < shorthand flags < ``--set``."""
    import dataclasses

    from .config import FLAT_ROLLOUT_KEYS, load_config

    cls = config_class(args.config_class)
    fields = {f.name for f in dataclasses.fields(cls)}
    flags: dict[str, Any] = {}
    for k, v in vars(args).items():
        if k in _CONTROL:
            continue
        if k in fields or k not in FLAT_ROLLOUT_KEYS:
            flags[k] = v
        else:  # a shorthand of nested rollout fields (--max-new-tokens: both roles' budgets)
            flags |= {f"rollout.{path}": v for path in FLAT_ROLLOUT_KEYS[k]}
    return load_config(cls, args.config, args.overrides, flags)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="envace", description="EnvACE: world-rehearsal RL for tool-using LLM agents")
    p.add_argument("--version", action="version", version=f"envace {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="SFT warm-up, EnvACE training and before/after evaluation on the embedded defaults")
    d.add_argument("--model", default="SmolLM2-135M-Instruct")
    d.add_argument(
        "--suite",
        default=DEMO_SUITE,
        help="built-in suite to train and evaluate on: shop-world (default), bank-world, files-world, builtin-world"
        " (persistent customers' records), shop-world-decide (shop-world's customers, requests whose right action"
        " depends on what the tools return), or bank, shop, files, builtin (a fresh random world per task)",
    )
    d.add_argument("--out", default="runs/demo")
    d.add_argument("--eval-tasks", type=int, default=100, help="held-out test tasks each model is evaluated on")
    d.add_argument(
        "--seed", type=int, default=0, help="seed of SFT and EnvACE training (the evaluation tasks stay the same)"
    )
    d.add_argument("--sft-steps", type=int, default=30)
    d.add_argument("--sft-batch", type=int, default=4, help="gold trajectories per SFT step")
    d.add_argument("--rl-iterations", type=int, default=4)
    d.add_argument("--rl-batch", type=int, default=2, help="tasks per RL iteration (x 4 trajectories each)")
    d.add_argument("--rl-lr", type=float, default=1e-5)
    d.add_argument(
        "--sft-kinds",
        default="all",
        help="task kinds whose gold the warm-up sees, comma-separated, or 'all' (default); e.g. "
        + ",".join(HEADROOM_KINDS)
        + " leaves the chained and recovery kinds to RL (the previous demo's warm-up)",
    )
    d.add_argument(
        "--reward",
        default=DEMO_REWARD,
        type=_reward_spec,
        help="the EnvACE step's reward spec: a name, a product a*b, or a YAML mapping {name: weight} "
        f"(default: {spec_label(DEMO_REWARD)})",
    )
    d.add_argument(
        "--fidelity-tasks",
        type=int,
        default=DEMO_FIDELITY_TASKS,
        help="test tasks of the Rehearse fidelity shadow set, measured after SFT and after each RL step (0: none)",
    )
    d.add_argument(
        "--full",
        action="store_true",
        help="also train the controls with the same budget from the same warm-up: caller-only (Rehearse frozen) and"
        " real-env GRPO, each evaluated and paired with EnvACE (each as long as the EnvACE step and its evaluation)",
    )
    d.add_argument("--untrained", action="store_true", help="also evaluate the untrained model first (~2-3 min)")
    d.add_argument("--quick", action="store_true", help="a few steps of everything (smoke run)")
    d.set_defaults(fn=cmd_demo)

    _config_command(sub, "sft", "envace.config:SFTConfig", cmd_sft, "supervised warm-up on gold trajectories")
    _config_command(sub, "train", "envace.config:TrainConfig", cmd_train, "role-wise GRPO training (any variant)")

    _config_command(
        sub,
        "eval",
        "envace.config:EvalConfig",
        cmd_eval,
        "evaluate a model in the real environment (optionally after private test-time rehearsal)",
    )

    c = sub.add_parser(
        "compare", help="paired comparison of two saved eval results (envace eval --out) on the same tasks"
    )
    c.add_argument("a", help="result A (the baseline)")
    c.add_argument("b", help="result B (difference is B - A)")
    c.add_argument("--resamples", type=int, default=10_000, help="paired bootstrap (and permutation) resamples")
    c.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")
    c.set_defaults(fn=cmd_compare)

    _config_command(
        sub,
        "fidelity",
        "envace.config:FidelityConfig",
        cmd_fidelity,
        "rehearsal fidelity: rehearsed vs real observations on shadow rollouts",
    )

    _config_command(
        sub,
        "experiment",
        "envace.evaluation.experiment:ExperimentConfig",
        cmd_experiment,
        "the paper's comparison in miniature: all arms x seeds x rehearsal budgets, report folder",
    )

    _config_command(
        sub,
        "rollout",
        "envace.config:RolloutBatchConfig",
        cmd_rollout,
        "roll out one batch and write the trajectories as JSON lines",
    )

    x = _config_command(
        sub,
        "export",
        "envace.config:ExportConfig",
        cmd_export,
        "write trajectories (or a suite's gold SFT trajectories) as "
        "OpenAI / HF chat records (tool_calls, tool_call_id) in JSON lines",
    )
    x.add_argument(
        "inputs",
        nargs="*",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="same as --set inputs=FILE,...: trajectories.jsonl (or a run folder), "
        "rollout --out, eval --trajectories --out, fidelity --out",
    )

    _config_command(
        sub,
        "rehearse",
        "envace.config:RehearseConfig",
        cmd_rehearse,
        "test-time scaling on one task: private rehearsal, memory, one real run",
    )

    _config_command(
        sub,
        "serve",
        "envace.config:ServeConfig",
        cmd_serve,
        "serve a model over an OpenAI-compatible HTTP API (for simulators, judges, evaluation)",
    )

    k = sub.add_parser("tasks", help="print tasks of a suite, or list the suites (--list)")
    k.add_argument(
        "--list", action="store_true", help="list the suites --suite accepts (built-in and plug-ins) and exit"
    )
    k.add_argument("--suite", default="builtin")
    k.add_argument("--split", default="train")
    k.add_argument("-n", type=int, default=2)
    k.add_argument("--seed", type=int, default=0)
    k.set_defaults(fn=cmd_tasks)
    return p


EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT, as a shell reports it)."""


def main(argv: list[str] | None = None) -> int:
    """Parse and run one command. A configured command gets its config (``--print-config``: printed instead),
    the others the parsed arguments; a bad config, name, path, model or server ends it with one line and exit code
    2, Ctrl-C with one line that says where the run can resume (:func:`interrupted_line`) and exit code 130."""
    from .backends.base import BackendError
    from .envs.base import EnvStartupError

    args = build_parser().parse_args(argv)
    cfg: Any = None
    try:
        if getattr(args, "config_class", None) is None:
            cfg = args
            return args.fn(args)
        cfg = command_config(args)
        if args.print_config:
            from .config import config_yaml

            print(config_yaml(cfg), end="")
            return 0
        return args.fn(cfg)
    except KeyboardInterrupt:
        print(interrupted_line(args.cmd, cfg), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except (ValueError, KeyError, OSError, ImportError, EnvStartupError, BackendError) as e:
        print(error_line(args.cmd, e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
