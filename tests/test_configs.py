"""The example configs (configs/*.yaml) load into TrainConfig as `envace train --config` loads them, and the
reference one holds METHOD.md's reference hyper-parameters."""

from pathlib import Path

import pytest
import yaml

from envace.config import TrainConfig, load_config

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_the_four_example_setups_are_there():
    assert {p.stem for p in CONFIGS} >= {"cpu", "gpu_lora", "8gpu_fsdp_vllm", "qwen3_8b_reference"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_into_train_config(path):
    cfg = load_config(TrainConfig, str(path))
    assert isinstance(cfg, TrainConfig) and cfg.rollout.mode == "rehearsal"
    if cfg.rollout_backend == "vllm":  # vLLM's log-probs are not the trainer's: they must be recomputed
        assert cfg.recompute_old_logprobs and cfg.device == "cpu"  # (the launcher gives each process its GPU)


def test_reference_config_is_the_papers_setting():
    cfg = load_config(TrainConfig, str(Path(__file__).parent.parent / "configs" / "qwen3_8b_reference.yaml"))
    assert cfg.model == "Qwen/Qwen3-8B" and cfg.variant == "envace" and cfg.advantage == "rolewise"
    assert cfg.group_size == 4 and cfg.lr == 1e-6 and cfg.batch_tasks == 16 and cfg.loss_agg == "token_mean"
    assert (cfg.rollout.rehearse.temperature, cfg.rollout.rehearse.top_p) == (0.6, 0.8) and cfg.kl_coef == 0.0


def test_accelerate_fsdp_config_is_an_accelerate_config():
    acc = yaml.safe_load((Path(__file__).parent.parent / "configs" / "accelerate" / "fsdp2_8gpu.yaml").read_text())
    assert acc["distributed_type"] == "FSDP" and acc["num_processes"] == 8 and acc["fsdp_config"]["fsdp_version"] == 2


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parent.parent / "configs" / "experiment").glob("*.yaml")), ids=lambda p: p.stem
)
def test_experiment_configs_load_into_experiment_config(path):
    from envace.evaluation.experiment import ARMS, ExperimentConfig, load_experiment_config

    cfg = load_experiment_config(str(path), [])
    assert isinstance(cfg, ExperimentConfig) and set(cfg.arms) <= set(ARMS) and len(cfg.seeds) >= 2


def test_a_saved_config_is_read_as_this_version_reads_it_so_only_real_differences_show():
    import json

    from envace.config import config_diff, saved_config_dict, to_dict
    from envace.evaluation.experiment import ExperimentConfig

    now = json.loads(json.dumps(to_dict(TrainConfig(group_size=8)), default=str))
    before = {k: v for k, v in now.items() if k not in ("group_size", "clip_eps_high")}  # written before them ...
    before["rollout"] = {**now["rollout"], "group_size": 8}  # ... with K where it used to be
    assert config_diff(saved_config_dict(TrainConfig, before), to_dict(TrainConfig(group_size=8))) == []
    assert [d[0] for d in config_diff(saved_config_dict(TrainConfig, before), to_dict(TrainConfig()))] == ["group_size"]
    gone = {**now, "no_such_field": 1}  # a field this version does not have: compared as saved, so it shows
    assert config_diff(saved_config_dict(TrainConfig, gone), to_dict(TrainConfig(group_size=8))) == [
        ("no_such_field", 1, "<absent>")
    ]
    exp = json.loads(json.dumps(to_dict(ExperimentConfig()), default=str))
    del exp["ood_split"], exp["sft_options"]
    assert config_diff(saved_config_dict(ExperimentConfig, exp), to_dict(ExperimentConfig())) == []
    assert saved_config_dict(ExperimentConfig, None) == json.loads(json.dumps(to_dict(ExperimentConfig()), default=str))


def test_a_config_file_with_a_base_is_laid_over_it_field_by_field_and_nested_mappings_merge(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text("group_size: 8\nlr: 2.0e-5\nrollout: {max_steps: 6, act: {temperature: 0.7}}\n")
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../root.yaml\nlr: 3.0e-5\nrollout: {act: {max_new_tokens: 64}}\n")
    (tmp_path / "leaf.yaml").write_text("base: sub/mid.yaml\niterations: 3\n")
    cfg = load_config(TrainConfig, str(tmp_path / "leaf.yaml"), ["lr=4e-5"])
    assert (cfg.group_size, cfg.iterations, cfg.lr, cfg.rollout.max_steps) == (8, 3, 4e-5, 6)
    assert (cfg.rollout.act.temperature, cfg.rollout.act.max_new_tokens) == (0.7, 64)  # both files' act fields
    assert load_config(TrainConfig, str(tmp_path / "sub" / "mid.yaml")).lr == 3e-5  # the base's path: its own folder


@pytest.mark.parametrize(
    "files, message",
    [
        ({"a.yaml": "base: b.yaml\n", "b.yaml": "base: a.yaml\n"}, "cycle"),
        ({"a.yaml": "base: missing.yaml\n"}, "is not a file"),
        ({"a.yaml": "base: [b.yaml]\n"}, "must name a config file"),
        ({"a.yaml": "base: b.yaml\n", "b.yaml": "- 1\n"}, "must hold a mapping"),
    ],
    ids=["cycle", "missing", "not-a-name", "base-not-a-mapping"],
)
def test_a_bad_base_is_an_error_that_names_the_file(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, str(tmp_path / "a.yaml"))


def test_the_val_configs_are_the_claims_config_with_only_the_fields_they_name_changed():
    from envace.config import to_dict
    from envace.evaluation.experiment import load_experiment_config

    root = Path(__file__).parent.parent / "configs" / "experiment"
    claims = to_dict(load_experiment_config(str(root / "shop-world-claims.yaml"), []))
    for name in ("shop-world-val-options", "shop-world-val-budget"):
        given = yaml.safe_load((root / f"{name}.yaml").read_text())
        cfg = to_dict(load_experiment_config(str(root / f"{name}.yaml"), []))
        assert given["base"] == "shop-world-claims.yaml" and cfg["eval_split"] == "val"
        assert {k for k in cfg if cfg[k] != claims[k]} <= set(given) - {"base"}


def test_the_decide_claims_run_trains_as_the_val_run_it_was_chosen_on():
    """shop-world-decide-claims.yaml takes its stages from shop-world-decide-val.yaml (chosen on val): every training
    setting is the same; only the arms, the evaluation split, the ood split and the curves differ."""
    from envace.config import to_dict
    from envace.evaluation.experiment import load_experiment_config

    root = Path(__file__).parent.parent / "configs" / "experiment"
    val = to_dict(load_experiment_config(str(root / "shop-world-decide-val.yaml"), []))
    claims = to_dict(load_experiment_config(str(root / "shop-world-decide-claims.yaml"), []))
    differ = {k for k in claims if claims[k] != val[k]}
    assert differ == {"arms", "eval_split", "ood_split", "ood_tasks", "success_every", "out_dir"}
    assert claims["suite"] == "shop-world-decide" and claims["eval_split"] == "test" and claims["ood_split"] == "ood"
