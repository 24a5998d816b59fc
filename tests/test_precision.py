"""bf16 only where it is fast (envace.core.precision): the decision rule with injected probes, the once-per-process
probe and note, every bf16 default that goes through it (HFBackend, SFT, the demo, eval, the trainer), and the
real probe on a CPU whose bf16 matmuls are slow (oneDNN limited to AVX2)."""

import os
import platform
import subprocess
import sys
import time

import pytest
import torch

from envace.core import precision
from envace.core.precision import Bf16Probe, bf16_setting, resolve_bf16, use_bf16

FAST = Bf16Probe(bf16_ms=0.3, float32_ms=0.7, capability="AVX512")
SLOW = Bf16Probe(bf16_ms=837.0, float32_ms=17.0, capability="AVX2")


def _never() -> Bf16Probe:
    raise AssertionError("the probe must not run here")


@pytest.fixture
def cpu_is(monkeypatch):
    """cpu_is(SLOW) / cpu_is(FAST): the process's probe answers so; notes already printed are forgotten."""
    monkeypatch.setattr(precision, "_said", set())

    def set_probe(p: Bf16Probe) -> None:
        monkeypatch.setattr(precision, "cpu_bf16_probe", lambda: p)

    return set_probe


# -- the decision rule --------------------------------------------------------------------------------------
@pytest.mark.parametrize("auto", [None, "auto", "AUTO"])
def test_auto_uses_bf16_on_a_cpu_only_where_the_probe_finds_it_faster(auto):
    assert resolve_bf16(auto, "cpu", probe=lambda: FAST) == (True, None)
    use, note = resolve_bf16(auto, "cpu", probe=lambda: SLOW)
    assert use is False
    assert (
        note == "bf16 is slower than float32 on this CPU (probe: 837.00 ms "
        "vs 17.00 ms, torch CPU capability AVX2); using float32"
    )


def test_an_explicit_true_is_honoured_with_a_warning_where_bf16_is_slow():
    assert resolve_bf16(True, "cpu", probe=lambda: FAST) == (True, None)
    use, note = resolve_bf16(True, torch.device("cpu"), probe=lambda: SLOW)
    assert use is True and "slower than float32" in note and note.endswith("using bf16 as requested")


def test_false_is_float32_without_probing():
    assert resolve_bf16(False, "cpu", probe=_never) == (False, None)
    assert resolve_bf16("off", "cuda:0", probe=_never, cuda_bf16=_never) == (False, None)


def test_on_a_gpu_torch_cuda_support_decides_and_the_cpu_probe_never_runs():
    assert resolve_bf16("auto", "cuda:1", probe=_never, cuda_bf16=lambda: True) == (True, None)
    use, note = resolve_bf16("auto", torch.device("cuda", 0), probe=_never, cuda_bf16=lambda: False)
    assert use is False and "does not support bf16" in note and note.endswith("using float32")
    use, note = resolve_bf16(True, "cuda", probe=_never, cuda_bf16=lambda: False)
    assert use is True and note.endswith("using bf16 as requested")


def test_a_bf16_setting_is_true_false_or_auto_and_anything_else_names_its_field():
    assert [bf16_setting(v) for v in (True, False, None, "auto", "on", "off", "true", "0")] == [
        True,
        False,
        "auto",
        "auto",
        True,
        False,
        True,
        False,
    ]
    with pytest.raises(ValueError, match="TrainConfig.bf16: bad value 'fast'"):
        bf16_setting("fast", "TrainConfig.bf16")
    with pytest.raises(ValueError):
        bf16_setting(1.0)


# -- once per process ---------------------------------------------------------------------------------------
def test_the_probe_runs_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: calls.append(1) or SLOW)
    monkeypatch.setattr(precision, "_said", set())
    precision.cpu_bf16_probe.cache_clear()
    try:
        assert [use_bf16("auto", "cpu") for _ in range(3)] + [use_bf16(True, "cpu")] == [False, False, False, True]
        assert precision.cpu_bf16_probe() is SLOW and len(calls) == 1
    finally:
        precision.cpu_bf16_probe.cache_clear()  # the next caller probes this CPU for real


def test_the_fallback_note_is_printed_once_not_per_call(cpu_is, capsys):
    cpu_is(SLOW)
    for _ in range(4):
        use_bf16("auto", "cpu")
    use_bf16(False, "cpu")
    err = capsys.readouterr().err
    assert (
        err.count("using float32") == 1
        and err.startswith("envace: bf16 is slower than float32")
        and err.count("\n") == 1
    )


def test_the_real_probe_times_both_dtypes_and_stays_cheap_even_where_bf16_is_slow():
    t0 = time.perf_counter()
    p = precision.probe_cpu_bf16()
    assert time.perf_counter() - t0 < 2.0  # ~0.1 s with a scalar bf16 kernel (it stops once bf16 is 4x slower)
    assert 0 < p.bf16_ms < 1e3 and 0 < p.float32_ms < 1e3 and p.capability == torch.backends.cpu.get_cpu_capability()


# -- every bf16 default goes through the rule ---------------------------------------------------------------
def test_hf_backend_auto_builds_float32_where_bf16_is_slow_and_packed_bf16_where_fast(tiny, cpu_is, capsys):
    from envace.backends.hf import HFBackend

    cpu_is(SLOW)
    be = HFBackend(*tiny, bf16="auto")
    assert be.bf16 is False and be._decoder is None  # model(...) in float32, no autocast
    assert "using float32" in capsys.readouterr().err
    forced = HFBackend(*tiny, bf16=True)  # asked for: honoured (packed bf16), with a warning
    assert forced.bf16 is True and forced._decoder is not None and forced._decoder.dtype == torch.bfloat16
    assert "using bf16 as requested" in capsys.readouterr().err
    cpu_is(FAST)
    fast = HFBackend(*tiny, bf16="auto")
    assert fast.bf16 is True and fast._decoder is not None and fast._decoder.dtype == torch.bfloat16
    assert HFBackend(*tiny)._decoder is None  # the default stays float32


@pytest.mark.parametrize("probe,expect", [(SLOW, False), (FAST, True)])
def test_sft_auto_runs_its_update_in_bf16_only_where_bf16_is_fast(tmp_path, cpu_is, monkeypatch, probe, expect):
    import envace.training.update as update
    from envace.config import SFTConfig
    from envace.training.sft import sft

    cpu_is(probe)
    seen = []
    real = update.optimizer_step
    monkeypatch.setattr(update, "optimizer_step", lambda *a, **kw: seen.append(kw["bf16"]) or real(*a, **kw))
    sft(
        SFTConfig(
            model="tiny-random",
            suite="files",
            n_tasks=2,
            steps=1,
            batch_tasks=1,
            bf16="auto",
            out_dir=str(tmp_path),
            tensorboard=False,
            progress=False,
        )
    )
    assert seen == [expect]


def test_the_demo_asks_for_bf16_sft_only_where_it_is_fast(monkeypatch, tmp_path):
    import envace.cli as cli
    import envace.evaluation.demo as demo_mod
    import envace.training.sft as sft_mod

    class Stop(Exception):
        pass

    asked = []
    monkeypatch.setattr(demo_mod, "demo_eval", lambda *a, **kw: None)
    monkeypatch.setattr(sft_mod, "sft", lambda cfg: asked.append(cfg) or (_ for _ in ()).throw(Stop()))
    args = cli.build_parser().parse_args(["demo", "--quick", "--model", "tiny-random", "--out", str(tmp_path)])
    with pytest.raises(Stop):
        cli.cmd_demo(args)
    assert asked[0].bf16 == "auto"


def test_eval_bf16_auto_generates_in_float32_where_bf16_is_slow(monkeypatch, cpu_is):
    import envace.backends.hf as hf
    from envace.backends.base import SamplingParams
    from envace.cli import build_parser, command_config
    from envace.evaluation.budget import evaluate_model
    from envace.rollout.engine import RolloutConfig

    resolved = lambda *argv: command_config(build_parser().parse_args(list(argv)))  # noqa: E731
    assert [resolved("eval", *a).bf16 for a in ([], ["--bf16"], ["--bf16", "auto"], ["--bf16", "off"])] == [
        False,
        True,
        "auto",
        False,
    ]
    assert resolved("serve", "--bf16", "auto").bf16 == "auto"
    built = []

    class Recorded(hf.HFBackend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append(self)

    monkeypatch.setattr(hf, "HFBackend", Recorded)
    cpu_is(SLOW)
    rc = RolloutConfig(max_steps=1, act=SamplingParams(max_new_tokens=4))
    evaluate_model("tiny-random", "files", n=1, rollout=rc, progress=False, bf16="auto")
    assert len(built) == 1 and built[0].bf16 is False and built[0]._decoder is None


def _train_cfg(tmp_path, **kw):
    from envace.config import TrainConfig

    return TrainConfig(
        model="tiny-random",
        suite="bank",
        iterations=1,
        batch_tasks=1,
        out_dir=str(tmp_path),
        tensorboard=False,
        progress=False,
        **kw,
    )


def test_trainer_precisions_and_the_old_logprob_recompute_follow_the_decided_values(tmp_path, cpu_is, tiny):
    from envace.training.distributed import Dist
    from envace.training.trainer import recomputes_old_logprobs, rollout_backend, rollout_bf16, update_bf16

    cpu_is(SLOW)
    auto = _train_cfg(tmp_path, bf16="auto")
    assert (update_bf16(auto), rollout_bf16(auto), recomputes_old_logprobs(auto)) == (False, False, False)
    assert rollout_backend(auto, tiny[0], tiny[1], Dist())._decoder is None
    rollouts_only = _train_cfg(
        tmp_path, rollout_bf16="auto"
    )  # falls back: float32 like the update, nothing to recompute
    assert (rollout_bf16(rollouts_only), recomputes_old_logprobs(rollouts_only)) == (False, False)
    forced = _train_cfg(tmp_path, rollout_bf16=True)  # honoured on a slow CPU; the float32 update then recomputes
    assert (rollout_bf16(forced), recomputes_old_logprobs(forced)) == (True, True)
    cpu_is(FAST)
    assert (update_bf16(auto), rollout_bf16(auto), recomputes_old_logprobs(auto)) == (True, True, False)
    assert (rollout_bf16(rollouts_only), recomputes_old_logprobs(rollouts_only)) == (True, True)


def test_configs_default_to_float32_and_take_auto_from_yaml_or_set():
    from envace.config import SFTConfig, TrainConfig, load_config

    assert (TrainConfig().bf16, TrainConfig().rollout_bf16, SFTConfig().bf16) == (False, None, False)
    cfg = load_config(TrainConfig, None, ["bf16=auto", "rollout_bf16=on"])
    assert cfg.bf16 == "auto" and cfg.rollout_bf16 is True
    assert load_config(SFTConfig, None, ["bf16=auto"]).bf16 == "auto"
    with pytest.raises(ValueError, match="TrainConfig.rollout_bf16: bad value 'fast'"):
        load_config(TrainConfig, None, ["rollout_bf16=fast"])


# -- the real probe on a CPU whose bf16 matmuls are slow ----------------------------------------------------
@pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="oneDNN ISA limits are an x86 setting"
)
def test_where_bf16_matmuls_are_slow_the_real_probe_picks_float32_and_says_so_once():
    """ONEDNN_MAX_CPU_ISA=AVX2 gives the kernels of a CPU without bf16 units (a bf16 matmul ~50x slower here);
    on a CPU that has none the probe finds the same."""
    code = (
        "from envace.backends.models import load; from envace.backends.hf import HFBackend; "
        "from envace.core.precision import cpu_bf16_probe\n"
        "m, tok = load('tiny-random'); be = HFBackend(m, tok, bf16='auto'); HFBackend(m, tok, bf16='auto')\n"
        "p = cpu_bf16_probe(); print(be.bf16, be._decoder is None, p.bf16_ms > p.float32_ms)\n"
    )
    env = dict(
        os.environ,
        ONEDNN_MAX_CPU_ISA="AVX2",
        PYTHONPATH=os.pathsep.join(
            [os.path.join(os.path.dirname(__file__), "..", "src"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["False", "True", "True"]
    assert p.stderr.count("bf16 is slower than float32 on this CPU") == 1 and "using float32" in p.stderr
