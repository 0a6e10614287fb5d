"""TRL's vLLM switches in the configuration: each acts, and a bad value is an error naming it
when the config is built (no vLLM, model or engine needed)."""

from __future__ import annotations

import logging

import pytest

from mtgrpo import GRPOConfig
from mtgrpo.compat.trl_fields import TRLCompatibleFields


def test_vllm_fields_act_and_only_the_group_port_has_no_effect():
    import dataclasses

    from mtgrpo.config import FIELD_SECTION

    # TRL's vLLM switches are native options (every one acting), in the vllm section ...
    native = {name for name, section in FIELD_SECTION.items() if section == "vllm"}
    assert {"use_vllm", "vllm_mode", "vllm_server_base_url",
            "vllm_importance_sampling_correction"} <= native
    # ... but for the NCCL group port (no effect) and TRL's deprecated name of clip_max
    effects = {f.name: f.metadata["effect"] for f in dataclasses.fields(TRLCompatibleFields)
               if f.name.startswith("vllm_") or f.name == "use_vllm"}
    assert effects == {"vllm_group_port": "none", "vllm_importance_sampling_cap": "alias"}
    GRPOConfig(use_vllm=True, vllm_mode="server", report_to="none")  # constructs


@pytest.mark.parametrize(("fields", "message"), [
    ({"vllm_mode": "remote"}, r"vllm_mode must be 'colocate' or 'server', got 'remote'"),
    ({"generation_backend": "hf"}, r"generation_backend='hf' asks for another engine"),
    ({"vllm_importance_sampling_mode": "token"},
     r"vllm_importance_sampling_mode='token' is not valid; use one of token_truncate"),
    ({"vllm_importance_sampling_clip_min": 5.0},
     r"clip_min=5\.0 exceeds clip_max=3\.0"),
    ({"generation_logprobs": False}, r"needs the engine's log-probs.*generation_logprobs=False"),
    ({"loss_type": "vespo"}, r"loss_type='vespo' with vllm_importance_sampling_correction"),
    ({"vllm_server_timeout": 0}, r"vllm_server_timeout=0 must be a number of seconds > 0"),
])
def test_bad_vllm_settings_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(use_vllm=True, report_to="none", **fields)


def test_without_use_vllm_the_correction_settings_are_not_checked():
    GRPOConfig(vllm_importance_sampling_mode="token", report_to="none")  # read only with vLLM


def test_the_deprecated_cap_sets_clip_max_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="mtgrpo.config"):
        args = GRPOConfig(use_vllm=True, vllm_importance_sampling_cap=2.0, report_to="none")
    assert args.vllm_importance_sampling_clip_max == 2.0
    assert "vllm_importance_sampling_cap is deprecated" in caplog.text


@pytest.mark.parametrize(("value", "message"), [
    ({"alpha": {"temperature": 0.5}}, r"task_generation\['alpha'\].*per-task setting is "
                                      r"max_completion_length"),
    ({"alpha": {"max_completion_length": 300}},
     r"max_completion_length=300 must be an int in \[1, max_completion_length=256\]"),
    ({"alpha": {"max_completion_length": 0}}, r"max_completion_length=0 must be an int"),
])
def test_bad_task_generation_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(task_generation=value, report_to="none")


def test_task_generation_of_another_type_is_named():
    with pytest.raises(TypeError, match=r"task_generation: \['alpha'\] \(list\) is not a mapping"):
        GRPOConfig(task_generation=["alpha"], report_to="none")


def test_task_generation_within_the_runs_limit_is_accepted():
    args = GRPOConfig(task_generation={"alpha": {"max_completion_length": 32}}, report_to="none")
    assert args.task_generation == {"alpha": {"max_completion_length": 32}}
