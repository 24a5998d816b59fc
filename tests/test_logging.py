"""envace.core.logging: metrics.jsonl always, other sinks by name (report_to); a sink that cannot start or fails says so
once on stderr and the run goes on. wandb and trackio are not installed here: their adapters are checked against
stand-in modules that record the calls."""

import os
import sys
import types

import pytest

import envace.core.logging as lg
from envace.config import RESUMABLE_FIELDS, SFTConfig, TrainConfig, config_diff, load_config, to_dict
from envace.core.logging import SINKS, MetricsLogger, read_metrics, report_sinks
from envace.core.registry import UnknownNameError


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(lg, "_WARNED", set())


def test_sink_registry_names_and_an_unknown_name_lists_the_valid_ones():
    assert SINKS.names() == ["jsonl", "tensorboard", "trackio", "wandb"]
    with pytest.raises(UnknownNameError, match="valid names: jsonl, tensorboard, trackio, wandb"):
        report_sinks(["tensorbord"])


def test_report_sinks_puts_jsonl_first_drops_repeats_and_tensorboard_false_drops_tensorboard():
    assert report_sinks(("tensorboard",)) == ("jsonl", "tensorboard")
    assert report_sinks("wandb, tensorboard,wandb") == ("jsonl", "wandb", "tensorboard")
    assert report_sinks(("wandb", "tensorboard"), tensorboard=False) == ("jsonl", "wandb")
    assert report_sinks(()) == report_sinks(None) == report_sinks(["jsonl"]) == ("jsonl",)


def test_a_missing_package_says_so_once_in_one_line_and_metrics_jsonl_is_still_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as where it is not installed
    monkeypatch.setitem(sys.modules, "trackio", None)
    for run in ("a", "b"):  # a second logger in the same process does not repeat it
        logger = MetricsLogger(str(tmp_path / run), ("wandb", "tensorboard", "trackio"))
        assert list(logger.sinks) == ["tensorboard"]
        logger.log(1, {"reward/mean": 0.5, "note": "x"})
        logger.log(2, {"reward/mean": 1})
        logger.close()
        assert read_metrics(str(tmp_path / run)) == [
            {"step": 1, "note": "x", "reward/mean": 0.5},
            {"step": 2, "reward/mean": 1.0},
        ]
        assert os.listdir(tmp_path / run / "tb")
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 2
        and err[0].startswith("envace: metrics sink 'wandb' is off: ")
        and err[1].startswith("envace: metrics sink 'trackio' is off: ")
    )
    assert all("not installed" in line or "halted" in line for line in err)


def test_a_sink_that_fails_while_logging_is_dropped_with_one_line_and_the_run_goes_on(tmp_path, capsys):
    class Flaky:
        def __init__(self, ctx):
            self.n = 0

        def log(self, step, metrics):
            raise OSError("disk gone")

        def close(self):
            raise AssertionError("a dropped sink is not closed")

    SINKS.add("flaky", Flaky)
    try:
        logger = MetricsLogger(str(tmp_path), ["flaky"])
        for step in range(3):
            logger.log(step, {"loss/x": step})
        logger.close()
    finally:
        SINKS.remove("flaky")
    assert capsys.readouterr().err.strip().splitlines() == [
        "envace: metrics sink 'flaky' is off: it failed while logging step 0: OSError: disk gone"
    ]
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [0, 1, 2]


def test_a_sink_whose_init_fails_names_the_error(tmp_path, monkeypatch, capsys):
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: (_ for _ in ()).throw(RuntimeError("no API key\nconfigured"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    MetricsLogger(str(tmp_path), ["wandb"]).log(0, {"a": 1})
    assert capsys.readouterr().err == "envace: metrics sink 'wandb' is off: RuntimeError: no API key configured\n"


def _recording_module(name, calls):
    mod = types.ModuleType(name)

    class Run:
        def log(self, metrics, step=None):
            calls.append(("log", metrics, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kw):
        calls.append(("init", kw))
        return Run()

    mod.init = init
    mod.log = lambda metrics, step=None: calls.append(("log", metrics, step))
    mod.finish = lambda: calls.append(("finish",))
    return mod


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_wandb_and_trackio_get_the_runs_name_config_and_numeric_metrics_by_step(name, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setitem(sys.modules, name, _recording_module(name, calls))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("TRACKIO_PROJECT", raising=False)
    logger = MetricsLogger(str(tmp_path / "run7"), [name], config={"lr": 0.1})
    logger.log(3, {"reward/mean": 1, "note": "text"})
    logger.close()
    init = calls[0][1]
    assert (init["project"], init["name"], init["config"]) == ("envace", "run7", {"lr": 0.1})
    assert calls[1:] == [("log", {"reward/mean": 1.0}, 3), ("finish",)]
    assert capsys.readouterr().err == ""


def test_a_resumed_logger_keeps_the_lines_up_to_its_step(tmp_path):
    logger = MetricsLogger(str(tmp_path), ())
    for step in (1, 2, 3):
        logger.log(step, {"x": step})
    MetricsLogger(str(tmp_path), (), resume_step=2).log(3, {"x": 30})
    assert [(r["step"], r["x"]) for r in read_metrics(str(tmp_path))] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    MetricsLogger(str(tmp_path), ())  # a fresh run starts a fresh log
    assert read_metrics(str(tmp_path)) == []


def test_report_to_in_the_configs_and_its_relation_to_tensorboard():
    assert TrainConfig().sinks == SFTConfig().sinks == ("jsonl", "tensorboard")
    assert TrainConfig(tensorboard=False).sinks == ("jsonl",)  # the older switch still turns TensorBoard off
    assert TrainConfig(report_to=("wandb", "tensorboard"), tensorboard=False).sinks == ("jsonl", "wandb")
    assert SFTConfig(report_to="tensorboard,wandb").report_to == ("tensorboard", "wandb")
    assert load_config(TrainConfig, overrides=["report_to=trackio,tensorboard"]).report_to == ("trackio", "tensorboard")
    assert load_config(SFTConfig, overrides=["report_to=[]"]).sinks == ("jsonl",)
    assert (
        config_diff(to_dict(TrainConfig()), to_dict(TrainConfig(report_to=("wandb",))), ignore=RESUMABLE_FIELDS) == []
    )  # a run resumes with other sinks
    with pytest.raises(
        ValueError,
        match=r"TrainConfig.report_to: unknown metrics sink 'tb'; valid names: jsonl, tensorboard, trackio, wandb",
    ):
        TrainConfig(report_to=("tb",))


def test_sft_asked_for_a_missing_sink_says_so_and_trains_with_metrics_jsonl(tmp_path, monkeypatch, capsys):
    from envace.training.sft import sft

    monkeypatch.setitem(sys.modules, "wandb", None)
    res = sft(
        SFTConfig(
            model="tiny-random",
            suite="files",
            n_tasks=2,
            steps=2,
            batch_tasks=1,
            out_dir=str(tmp_path),
            report_to=("wandb", "tensorboard"),
            tensorboard=False,
            progress=False,
        )
    )
    err = [line for line in capsys.readouterr().err.splitlines() if "metrics sink" in line]
    assert len(err) == 1 and err[0].startswith("envace: metrics sink 'wandb' is off")
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2] and res.checkpoint
    assert not os.path.exists(tmp_path / "tb")  # tensorboard=False wins over report_to
