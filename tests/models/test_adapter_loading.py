import warnings

import torch

from mtgrpo.models import apply_lora, load_model, load_tokenizer
from mtgrpo.models.lora import quiet_peft_wrapping
from tolerance import assert_close_f32


def test_a_saved_lora_adapter_loads_with_its_base(tiny_model_dir, tmp_path):
    base = load_model(str(tiny_model_dir))
    model = apply_lora(base, {"r": 4, "init_lora_weights": False})  # non-zero adapter
    ids = torch.tensor([[72, 101, 108, 108, 111]])
    expected = model(ids).logits
    model.save_pretrained(tmp_path)
    load_tokenizer(str(tiny_model_dir)).save_pretrained(tmp_path)

    loaded = load_model(str(tmp_path), for_training=False)
    # the same weights and adapter: equal up to float32 rounding of logits below 1 (a missing
    # adapter changes them by more than 1e-2)
    assert_close_f32(loaded(ids).logits, expected, ulps=8)
    assert not any(p.requires_grad for p in loaded.parameters())
    trainable = load_model(str(tmp_path), for_training=True)
    assert {n for n, p in trainable.named_parameters() if p.requires_grad}
    assert all(
        "lora_" in n for n, p in trainable.named_parameters() if p.requires_grad
    )
    assert load_tokenizer(str(tmp_path)).encode("hi") == load_tokenizer(
        str(tiny_model_dir)).encode("hi")


def test_an_adapter_trained_on_a_relative_path_loads_from_anywhere(tiny_model_dir, tmp_path,
                                                                    monkeypatch):
    # a run's warm start is named relative to where the training ran (runs/NAME/sft/model);
    # its adapter must still load when evaluated from another directory
    import json
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "runs" / "sft" / "model")
    monkeypatch.chdir(tmp_path)
    model = apply_lora(load_model("runs/sft/model"), {"r": 4, "init_lora_weights": False})
    model.save_pretrained(tmp_path / "adapter")
    base = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert base["base_model_name_or_path"] == str(tmp_path / "runs" / "sft" / "model")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ids = torch.tensor([[72, 101, 108, 108, 111]])
    # the same weights and adapter: float32 rounding at most
    assert_close_f32(load_model(str(tmp_path / "adapter"), for_training=False)(ids).logits,
                     model(ids).logits, ulps=8)


def test_an_adapter_naming_a_missing_relative_base_says_where_it_looked(tiny_model_dir, tmp_path,
                                                                         monkeypatch):
    import json

    import pytest

    model = apply_lora(load_model(str(tiny_model_dir)), {"r": 4})
    model.save_pretrained(tmp_path / "adapter")
    config_file = tmp_path / "adapter" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = "runs/quickstart/sft/model"
    config_file.write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"names the base model 'runs/quickstart/sft/model', a "
                                         r"relative path that does not exist from here"):
        load_model(str(tmp_path / "adapter"), for_training=False)


def test_wrapping_and_loading_adapters_do_not_repeat_peft_internal_deprecations(tiny_model_dir,
                                                                               tmp_path):
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a
    model; users cannot act on that, so it is not shown. Other warnings still are."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = apply_lora(load_model(str(tiny_model_dir)), {"r": 4})
        model.save_pretrained(tmp_path)
        load_tokenizer(str(tiny_model_dir)).save_pretrained(tmp_path)
        load_model(str(tmp_path), for_training=True)
        with quiet_peft_wrapping():
            warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "is_gradient_checkpointing" in m], messages
    assert "another deprecation" in messages
