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
