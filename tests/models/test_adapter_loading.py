import torch

from mtgrpo.models import apply_lora, load_model, load_tokenizer
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
