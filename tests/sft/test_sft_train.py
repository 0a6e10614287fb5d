"""``sft_train`` on the tiny local model: the loss formula, accumulation, memorisation, saving."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file

from mtgrpo.models import load_model, load_tokenizer
from mtgrpo.reporting import read_metrics
from mtgrpo.sft import SFTConfig, completion_cross_entropy, sft_train
from mtgrpo.sft.data import SFTExample, collate_examples, encode_examples, prompt_completion_pairs
from mtgrpo.sft.train import accumulate_step_gradients
from mtgrpo.tasks.prompt_set import PromptSet
from tolerance import assert_close_f32

MEMORISE = [
    {"prompt": "Q: 2+3?\nA:", "completion": " 5"},
    {"prompt": [{"role": "user", "content": "Capital of France?"}], "completion": "Paris"},
    {"messages": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "blue"}]},
]


def _config(tmp_path, **options) -> SFTConfig:
    # float32: the tests compare sums and gradients computed in other orders (bf16: auto would
    # round them apart on CPUs with native bf16); the bf16 path has a test of its own
    defaults = {"output_dir": str(tmp_path / "run"), "max_steps": 2, "learning_rate": 1e-3,
                "logging_steps": 1, "per_device_train_batch_size": 4, "seed": 0, "bf16": False}
    return SFTConfig(**{**defaults, **options})


def _random_examples(seed: int, count: int) -> list[SFTExample]:
    rng = random.Random(seed)
    return [SFTExample(tuple(rng.randrange(259) for _ in range(rng.randint(1, 9))),
                       tuple(rng.randrange(259) for _ in range(rng.randint(1, 9))), row)
            for row in range(count)]


def _reference_ce(model, examples, completion_only_loss=True) -> torch.Tensor:
    """Plain loop: each example alone, unpadded, ``-log_softmax(logits)[next token]`` summed over
    its target tokens."""
    total = torch.zeros(())
    for example in examples:
        ids = list(example.prompt_ids + example.completion_ids)
        first = len(example.prompt_ids) if completion_only_loss else 1
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [T, V]
        logps = torch.log_softmax(logits, dim=-1)
        for t in range(first, len(ids)):
            total = total - logps[t - 1, ids[t]]
    return total


def test_uniform_logits_give_log_vocab_per_token(tiny_model_dir):
    # With a zero output head every logit is 0, so p = 1/V for each token and the token-mean
    # cross-entropy is exactly log V (V = 259), whatever the lengths and padding.
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    examples = _random_examples(0, 5)
    batch = collate_examples(examples, pad_token_id=256)
    summed = completion_cross_entropy(model, batch)
    # a float32 sum of ~25 equal terms of 5.56, then a division: tens of roundings of 5.56 at
    # most; a target summed but not counted (or counted, not summed) is off by 5.56 / 25 = 0.2
    assert_close_f32(summed.item() / batch.num_target_tokens, math.log(259), ulps=32)


@pytest.mark.parametrize("completion_only_loss", [True, False])
def test_batched_loss_matches_a_per_example_loop(tiny_model_dir, completion_only_loss):
    model = load_model(tiny_model_dir, for_training=False)
    for seed in range(3):
        examples = _random_examples(seed, 4)
        batch = collate_examples(examples, pad_token_id=256,
                                 completion_only_loss=completion_only_loss)
        with torch.no_grad():
            batched = completion_cross_entropy(model, batch)
            reference = _reference_ce(model, examples, completion_only_loss)
        # Padded batch against one example at a time: other matmul and attention shapes, a sum
        # of ~25 cross-entropies near 5.6 in another order (float32 rounding of the ~140 total).
        # A shifted target or a counted pad changes the sum by about 5.
        assert_close_f32(batched, reference, ulps=64)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_accumulated_gradient_is_the_token_mean_whatever_the_micro_batches(tiny_model_dir):
    model = load_model(tiny_model_dir)
    examples = _random_examples(7, 6)
    tokens = sum(len(e.completion_ids) for e in examples)
    reference = _reference_ce(model, examples)
    (reference / tokens).backward()
    expected = _grads(model)
    splits = [{"per_device_train_batch_size": 6}, {"per_device_train_batch_size": 1},
              {"per_device_train_batch_size": 4}, {"max_tokens_per_microbatch": 20}]
    for options in splits:
        model.zero_grad(set_to_none=True)
        config = SFTConfig(**options, bf16=False)  # float32: compared with a float32 sum
        loss_sum, targets, _ = accumulate_step_gradients(model, examples, config, 256,
                                                         torch.device("cpu"))
        assert targets == tokens
        # float32 rounding only, as in the test above; the gradients are summed over other
        # micro-batches (a micro-batch averaged over its own tokens instead of the step's would
        # scale its share by a factor of 2 or more)
        assert_close_f32(loss_sum, reference.item(), ulps=64)
        got = _grads(model)
        assert got.keys() == expected.keys()
        for name, grad in expected.items():
            assert_close_f32(got[name], grad, ulps=64, msg=name)


def test_memorises_a_tiny_set_and_generates_it_greedily(tiny_model_dir, tmp_path):
    config = _config(tmp_path, max_steps=30, learning_rate=1e-2, lr_scheduler_type="constant",
                     logging_steps=10)
    result = sft_train(str(tiny_model_dir), None, MEMORISE, config)
    # random init: the first loss is about log V = 5.56; memorised: close to 0
    assert result.losses[0] > 4.0
    assert result.final_loss < 0.05
    assert sum(result.losses[-5:]) < sum(result.losses[:5]) / 20
    tokenizer = load_tokenizer(tiny_model_dir)
    pairs = prompt_completion_pairs(MEMORISE)
    prompts = PromptSet([{"prompt": p.prompt, "task": "t"} for p in pairs], tokenizer)
    for number, pair in enumerate(pairs):
        ids = torch.tensor([prompts.tokens(number)])
        out = result.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=12)
        assert tokenizer.decode(out[0, ids.shape[1]:]) == pair.completion + "<|im_end|>"
    records = read_metrics(result.output_dir, split="train")
    assert [r["step"] for r in records] == [10, 20, 30]
    assert records[-1]["learning_rate"] == pytest.approx(1e-2)
    assert records[-1]["loss"] < records[0]["loss"]
    assert all(r["throughput/tokens_per_second"] > 0 for r in records)
    # 3 examples of the byte tokenizer: " 5", "Paris", "blue" + EOS = 3 + 6 + 5 tokens per step
    assert records[0]["tokens/trained"] == 10 * 14
    assert result.trained_tokens == 30 * 14
    # the saved model is the trained one
    reloaded = load_model(result.model_dir, for_training=False)
    for name, tensor in result.model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0)


def test_lora_saves_an_adapter_and_trains_only_it(tiny_model_dir, tmp_path):
    base = load_model(tiny_model_dir)
    original = {n: p.detach().clone() for n, p in base.named_parameters()}
    result = sft_train(base, None, MEMORISE, _config(tmp_path, learning_rate=1e-2),
                       {"r": 4, "lora_alpha": 8})
    assert isinstance(result.model, PeftModel)
    assert result.adapter_dir is None
    assert (result.model_dir / "adapter_model.safetensors").is_file()
    assert not (result.model_dir / "model.safetensors").exists()
    adapter = load_file(str(result.model_dir / "adapter_model.safetensors"))
    assert adapter
    assert all("lora_" in name for name in adapter)
    for name, param in result.model.get_base_model().named_parameters():
        if "lora_" not in name:
            key = name.replace(".base_layer", "")
            torch.testing.assert_close(param.detach(), original[key], rtol=0, atol=0)
    options = json.loads((result.output_dir / "sft_config.json").read_text())
    assert options["lora"]["r"] == 4
    assert options["sft"]["max_steps"] == 2


def test_merge_lora_saves_a_full_model_equal_to_base_plus_adapter(tiny_model_dir, tmp_path):
    result = sft_train(str(tiny_model_dir), None, MEMORISE,
                       _config(tmp_path, learning_rate=1e-2, merge_lora=True),
                       {"r": 4, "lora_alpha": 8})
    assert not isinstance(result.model, PeftModel)
    assert (result.model_dir / "config.json").is_file()
    assert (result.adapter_dir / "adapter_model.safetensors").is_file()
    merged = load_model(result.model_dir, for_training=False)
    with_adapter = PeftModel.from_pretrained(load_model(tiny_model_dir, for_training=False),
                                             result.adapter_dir)
    base = load_model(tiny_model_dir, for_training=False)
    ids = torch.tensor([[5, 17, 99, 200, 42, 7]])
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
        # W + s B A (rounded into W) against W x + s B (A x): float32 rounding through every
        # layer; the base model alone is off by > 1e-3 (below)
        assert_close_f32(merged_logits, with_adapter(input_ids=ids).logits, ulps=32)
        assert not torch.allclose(merged_logits, base(input_ids=ids).logits, atol=1e-3)


def test_eval_fraction_holds_out_examples_and_logs_eval_loss(tiny_model_dir, tmp_path):
    rows = [{"prompt": f"n{i}:", "completion": str(i)} for i in range(10)]
    result = sft_train(str(tiny_model_dir), None, rows,
                       _config(tmp_path, max_steps=4, eval_fraction=0.2, eval_steps=2))
    assert (result.num_train_examples, result.num_eval_examples) == (8, 2)
    evals = read_metrics(result.output_dir, split="eval")
    assert [r["step"] for r in evals] == [2, 4]
    assert result.eval_loss == evals[-1]["loss"]
    assert math.isfinite(result.eval_loss)


@pytest.mark.parametrize(
    ("rows", "options", "match"),
    [
        pytest.param([{"prompt": "x", "answer": "y"}], {}, "needs 'prompt' and 'completion'",
                     id="columns"),
        pytest.param([], {}, "no training rows", id="empty"),
        pytest.param([{"prompt": "x", "completion": "y", "split": "test"}], {}, "test data",
                     id="test-split"),
        pytest.param(MEMORISE, {"merge_lora": True},
                     "merge_lora=True but the model has no LoRA", id="merge-without-lora"),
        # 3 examples: round(0.9 * 3) = 3 held out, none left
        pytest.param(MEMORISE, {"eval_fraction": 0.9}, "leaves none to train on",
                     id="eval-fraction"),
    ],
)
def test_bad_input_is_refused_before_training(tiny_model_dir, tmp_path, rows, options, match):
    with pytest.raises(ValueError, match=match):
        sft_train(str(tiny_model_dir), None, rows, _config(tmp_path, **options))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_earlier_run_is_not_overwritten_silently(tiny_model_dir, tmp_path):
    sft_train(str(tiny_model_dir), None, MEMORISE, _config(tmp_path, max_steps=1))
    with pytest.raises(ValueError, match=r"already holds an SFT run \(metrics.jsonl, model\)"):
        sft_train(str(tiny_model_dir), None, MEMORISE, _config(tmp_path, max_steps=1))
    result = sft_train(str(tiny_model_dir), None, MEMORISE,
                       _config(tmp_path, max_steps=3, overwrite_output_dir=True))
    assert [r["step"] for r in read_metrics(result.output_dir)] == [1, 2, 3]


def test_encode_examples_feeds_the_trainer_the_same_ids(tiny_model_dir):
    # the loop trains on encode_examples' ids: completion + EOS after the PromptSet prompt
    tokenizer = load_tokenizer(tiny_model_dir)
    (example,) = encode_examples(prompt_completion_pairs(MEMORISE[:1]), tokenizer).examples
    assert tokenizer.decode(list(example.prompt_ids + example.completion_ids)) == (
        "Q: 2+3?\nA: 5<|im_end|>")


def test_examples_beyond_the_model_positions_are_refused(tiny_model_dir, tmp_path):
    # the tiny model has 512 positions; a 600-byte completion is 601 tokens with its EOS
    rows = [{"prompt": "p", "completion": "x" * 600}, *MEMORISE]
    with pytest.raises(ValueError, match=r"1 of 4 examples \(longest 602 tokens\) are longer "
                                         "than the model's max_position_embeddings=512"):
        sft_train(str(tiny_model_dir), None, rows, _config(tmp_path))
    # max_length=512 cuts that completion to fit
    result = sft_train(str(tiny_model_dir), None, rows, _config(tmp_path, max_steps=1,
                                                                 max_length=512))
    assert result.trained_tokens == 511 + 14


def test_bf16_autocast_gives_the_float32_loss_within_bfloat16_precision(tiny_model_dir,
                                                                         tmp_path):
    # Same seed, same first batch, same initial weights: the first step's loss differs only by
    # bfloat16 rounding of the matmuls (8 bits of mantissa: ~0.4 % per operation).
    results = [sft_train(str(tiny_model_dir), None, MEMORISE,
                         _config(tmp_path / str(bf16), max_steps=1, bf16=bf16))
               for bf16 in (False, True)]
    assert results[1].losses[0] == pytest.approx(results[0].losses[0], rel=2e-2)
    assert results[1].losses[0] != results[0].losses[0]
