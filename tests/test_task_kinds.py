"""Training on chosen task kinds: ``SFTConfig.task_kinds`` / ``TrainConfig.task_kinds`` are validated against the
built-in kinds, ``load_tasks_of_kinds`` returns n tasks of those kinds (the first ones of the split for seed 0),
a filter that keeps nothing is an error, and SFT and RL really load their training tasks through the filter."""

from __future__ import annotations

import pytest

from envace.config import SFTConfig, TrainConfig, apply_overrides, from_dict
from envace.envs import SUITES, load_tasks, load_tasks_of_kinds
from envace.core.types import Task

# ------------------------------------------------------------------------------------- config values


@pytest.mark.parametrize("cls", [SFTConfig, TrainConfig])
def test_task_kinds_is_a_typed_config_value(cls):
    assert cls().task_kinds is None  # every kind
    assert cls(task_kinds=["chained", "recovery", "chained"]).task_kinds == ("chained", "recovery")
    assert from_dict(cls, {"task_kinds": ["simple"]}).task_kinds == ("simple",)  # as YAML gives it
    assert from_dict(cls, apply_overrides({}, ["task_kinds=chained,recovery"])).task_kinds == (
        "chained",
        "recovery",
    )  # --set
    assert from_dict(cls, apply_overrides({"task_kinds": ["simple"]}, ["task_kinds=none"])).task_kinds is None


@pytest.mark.parametrize("cls", [SFTConfig, TrainConfig])
def test_an_unknown_or_empty_task_kind_is_an_error_listing_the_valid_ones(cls):
    with pytest.raises(
        ValueError,
        match=rf"{cls.__name__}\.task_kinds: .*'chaned'.*valid kinds: recovery, chained, read_only_report, simple",
    ):
        cls(task_kinds=["chaned"])
    with pytest.raises(ValueError, match="no kind .*valid kinds: recovery"):
        cls(task_kinds=[])


# ------------------------------------------------------------------------------------- loading


def test_load_tasks_of_kinds_gives_n_tasks_of_those_kinds_in_split_order():
    got = load_tasks_of_kinds("bank", "train", 40, 0, ("chained",))
    assert len(got) == 40 and {t.metadata["kind"] for t in got} == {"chained"}
    # chained is ~7% of bank train: the first 40 of them, as a longer prefix of the split holds them
    want = [t for t in load_tasks("bank", "train", n=1280) if t.metadata["kind"] == "chained"][:40]
    assert [t.id for t in got] == [t.id for t in want]
    two = load_tasks_of_kinds("bank", "train", 30, 0, ("recovery", "chained"))
    assert len(two) == 30 and {t.metadata["kind"] for t in two} == {"recovery", "chained"}
    ids = [int(t.id.rsplit("-", 1)[1]) for t in two]
    assert ids == sorted(ids)


def test_load_tasks_of_kinds_without_a_filter_is_load_tasks():
    assert [t.to_dict() for t in load_tasks_of_kinds("shop", "train", 12, 3, None)] == [
        t.to_dict() for t in load_tasks("shop", "train", n=12, seed=3)
    ]
    a, b = (load_tasks_of_kinds("files", "val", 10, 5, ("simple",)) for _ in range(2))
    assert [t.id for t in a] == [t.id for t in b] and all(
        t.metadata["kind"] == "simple" and t.split == "val" for t in a
    )


@pytest.fixture
def unlabelled_suite():
    """A suite whose tasks carry no kind (as BFCL, tau2 and MCP tasks do), two of them labelled simple."""

    def loader(spec: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        tasks = [
            Task(id=f"t{i}", env="bank", system_prompt="", user_turns=["hi"], tools=[], env_config={}, split=split)
            for i in range(5)
        ]
        for t in tasks[:2]:
            t.metadata = {"kind": "simple"}
        return tasks[: n or 5]

    SUITES.add("nokinds", loader)
    yield "nokinds"
    SUITES.remove("nokinds")


def test_a_filter_that_keeps_no_task_is_an_error_naming_the_kinds_there_are(unlabelled_suite):
    with pytest.raises(
        ValueError,
        match=r"TrainConfig.task_kinds=\['chained'\] keeps none of 5 nokinds/train tasks; their kinds: \{'simple': 2, "
        r"'<no kind label>': 3\}",
    ):
        load_tasks_of_kinds(unlabelled_suite, "train", 8, 0, ("chained",), "TrainConfig.task_kinds")
    # a suite that runs out returns the tasks of the kind it has
    assert [t.id for t in load_tasks_of_kinds(unlabelled_suite, "train", 8, 0, ("simple",))] == ["t0", "t1"]


# ------------------------------------------------------------------------------------- SFT and RL use it


class _Loaded(Exception):
    """Raised by the spy once the training tasks are loaded: nothing is trained."""


def _spy(monkeypatch, module) -> list[list[Task]]:
    seen: list[list[Task]] = []
    real = module.load_tasks_of_kinds

    def spy(*a, **kw):
        seen.append(real(*a, **kw))
        raise _Loaded

    monkeypatch.setattr(module, "load_tasks_of_kinds", spy)
    return seen


def test_sft_warms_up_only_on_the_chosen_kinds(tmp_path, monkeypatch):
    import envace.training.sft as sft_mod

    seen = _spy(monkeypatch, sft_mod)
    with pytest.raises(_Loaded):
        sft_mod.sft(
            SFTConfig(
                model="tiny-random",
                suite="bank",
                n_tasks=20,
                steps=1,
                task_kinds=("simple", "read_only_report"),
                out_dir=str(tmp_path),
                tensorboard=False,
                progress=False,
            )
        )
    assert len(seen[0]) == 20 and {t.metadata["kind"] for t in seen[0]} == {"simple", "read_only_report"}


def test_rl_trains_only_on_the_chosen_kinds(tmp_path, monkeypatch):
    import envace.training.trainer as trainer

    seen = _spy(monkeypatch, trainer)
    with pytest.raises(_Loaded):
        trainer.train(
            TrainConfig(
                model="tiny-random",
                suite="bank",
                iterations=1,
                batch_tasks=1,
                n_train_tasks=10,
                task_kinds=("chained",),
                out_dir=str(tmp_path),
                tensorboard=False,
                progress=False,
            )
        )
    assert len(seen[0]) == 10 and {t.metadata["kind"] for t in seen[0]} == {"chained"}
