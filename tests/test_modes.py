"""Rollout modes (envace.rollout.modes.MODES): what each entry declares is what a rollout in the mode does."""

import pytest

from envace.backends.scripted import ScriptedBackend
from envace.chat.parsing import render_act
from envace.chat.prompts import REHEARSE_SYSTEM
from envace.core.registry import UnknownNameError
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.rollout.modes import MODES, Answer, Observer, RolloutMode
from envace.rollout.variants import VARIANTS

from spies import spied_bank_tasks

OPENED: list[str] = []  # task id of every real environment opened
EXECUTED: list[str] = []  # every call a real environment executed


@pytest.fixture
def tasks():
    out = spied_bank_tasks(
        "counted_bank", 2, on_open=lambda t: OPENED.append(t.id), on_call=lambda c: EXECUTED.append(c.key())
    )
    OPENED.clear()
    EXECUTED.clear()
    return out


def _script(tasks):
    """Act: the task's first gold call, then a reply; Rehearse (whoever plays it): a fixed observation."""

    def respond(prompt: str) -> str:
        if REHEARSE_SYSTEM[:40] in prompt:
            return '<observation>{"rehearsed": true}</observation>'
        task = next(t for t in tasks if t.user_turns[0] in prompt)
        return render_act([task.flat_gold()[0]]) if "<|im_start|>tool" not in prompt else "All done."

    return respond


def _rehearse_prompts(backend: ScriptedBackend) -> list[str]:
    return [p for p in backend.prompts if REHEARSE_SYSTEM[:40] in p]


@pytest.mark.parametrize("name", MODES.names())
def test_each_mode_entry_says_who_rehearses_what_is_trained_and_whether_a_real_env_runs(tokenizer, tasks, name):
    mode = MODES.get(name)
    backends = {"policy": ScriptedBackend(tokenizer, _script(tasks))}
    helpers = {h: ScriptedBackend(tokenizer, _script(tasks)) for h in ("rehearser", "simulator")}
    cfg = RolloutConfig(max_steps=4)
    trajs = RolloutEngine(backends["policy"], cfg, **helpers, mode=name).run(tasks, group_size=2)
    backends |= helpers

    # who plays Rehearse: the only backend asked Rehearse's prompts (none where the environment answers)
    asked = {who for who, be in backends.items() if _rehearse_prompts(be)}
    assert asked == (set() if mode.rehearsed_by == "environment" else {mode.rehearsed_by})
    sources = {s for t in trajs for step in t.steps for s in step.sources}
    assert ("real" in sources) == mode.needs_env and sources

    # whether a real environment is needed: one opened per trajectory and every call executed there, or none
    assert len(OPENED) == (len(trajs) if mode.needs_env else 0)
    assert len(EXECUTED) == (sum(len(s.calls) for t in trajs for s in t.steps) if mode.needs_env else 0)

    # which models are trained: exactly the models whose generations became rows
    def producer(row) -> str:
        text = tokenizer.decode(row.prompt_ids)
        return next(who for who, be in backends.items() if text in be.prompts)

    made_rows = {producer(r) for t in trajs for r in t.rows}
    assert made_rows == set(mode.trained_models)
    rehearse_rows = any(r.role == "rehearse" for t in trajs for r in t.rows)
    assert rehearse_rows == (mode.rehearsed_by in mode.trained_models)


def test_every_variant_trains_models_of_its_modes_entry():
    for name in VARIANTS:
        v = VARIANTS.get(name)
        assert v.rollout_mode is MODES.get(v.mode)
        assert (
            {v.model_of(role) for role in v.train_roles} <= set(v.trained_models) == set(v.rollout_mode.trained_models)
        )


def test_an_unknown_mode_is_a_one_line_error_listing_the_valid_ones(tokenizer):
    with pytest.raises(UnknownNameError) as err:
        RolloutEngine(ScriptedBackend(tokenizer, lambda p: ""), RolloutConfig(), mode="rehersal")
    msg = str(err.value)
    assert "\n" not in msg and "'rehersal'" in msg
    assert all(name in msg for name in ("per_role", "real", "rehearsal", "simulator"))


@pytest.mark.parametrize("name", [n for n in MODES.names() if MODES.get(n).helper])
def test_a_mode_without_its_helper_says_which_keyword_is_missing(tokenizer, name):
    with pytest.raises(ValueError, match=f"{MODES.get(name).helper}="):
        RolloutEngine(ScriptedBackend(tokenizer, lambda p: ""), RolloutConfig(), mode=name)


class _Fixed(Observer):
    """Answers every call with the same observation, without a model."""

    streams_with_policy = True

    def observe(self, engine, asks):
        return [Answer({"fixed": True}, "fixed") for _ in asks]


def test_a_new_mode_is_one_entry_and_no_engine_change(tokenizer, tasks):
    MODES.add("fixed", RolloutMode("a fixed answer", lambda policy, helper: _Fixed()))
    try:
        be = ScriptedBackend(tokenizer, _script(tasks))
        trajs = RolloutEngine(be, RolloutConfig(max_steps=4), mode="fixed").run(tasks, group_size=1)
    finally:
        MODES.remove("fixed")
    assert all(t.steps[0].sources == ["fixed"] and t.steps[0].observations == [{"fixed": True}] for t in trajs)
    assert not _rehearse_prompts(be) and OPENED == []
