"""SFT data: (prompt, completion) pairs, token ids in the GRPO rendering, and the loss mask."""

from __future__ import annotations

import random

import pytest
import torch

from mtgrpo.models import load_tokenizer
from mtgrpo.sft.data import (
    SFTExample,
    collate_examples,
    encode_examples,
    prompt_completion_pairs,
)
from mtgrpo.tasks.prompt_set import PromptSet

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def _rows():
    return [
        {"prompt": "Q: 7*6?\nA:", "completion": " 42", "task": "text"},
        {"prompt": CHAT, "completion": "<answer> 4 </answer>", "task": "chat"},
        {"messages": [*CHAT, {"role": "assistant", "content": "four"}]},
        {"prompt": CHAT, "completion": [{"role": "assistant", "content": "IV"}]},
    ]


def test_pairs_from_prompt_completion_messages_and_conversational_completions():
    pairs = prompt_completion_pairs(_rows())
    assert [p.completion for p in pairs] == [" 42", "<answer> 4 </answer>", "four", "IV"]
    assert [p.task for p in pairs] == ["text", "chat", "sft", "sft"]
    # messages: everything before the final assistant turn is the prompt
    assert pairs[2].prompt == CHAT


def test_custom_column_names():
    rows = [{"question": "hi", "reply": "hello"}, {"dialog": [*CHAT, {"role": "assistant",
                                                                      "content": "4"}]}]
    pairs = prompt_completion_pairs(rows, prompt_column="question", completion_column="reply",
                                    messages_column="dialog")
    assert [(p.prompt, p.completion) for p in pairs] == [("hi", "hello"), (CHAT, "4")]


@pytest.mark.parametrize(
    ("rows", "error", "match"),
    [
        ([], ValueError, "no training rows"),
        ([{"question": "x", "answer": "y"}], ValueError,
         r"needs 'prompt' and 'completion'.*solutions_from_rows"),
        ([{"prompt": "x", "completion": "   "}], ValueError, "empty 'completion'"),
        ([{"prompt": "x", "completion": 3}], TypeError, "must be a string"),
        ([{"messages": [{"role": "user", "content": "x"}]}], ValueError,
         "must end with the assistant turn"),
        ([{"messages": "x"}], ValueError, "list of chat messages"),
        ([{"prompt": "x", "completion": [{"role": "user", "content": "y"}]}], ValueError,
         "assistant messages only"),
        ([{"prompt": "x", "completion": "y", "split": "test"}], ValueError, "test data"),
        ([{"prompt": "x", "completion": "y", "data_source": "countdown-easy-test"}], ValueError,
         "evaluation rows must not be used for training"),
    ],
)
def test_bad_rows_name_the_fix(rows, error, match):
    with pytest.raises(error, match=match):
        prompt_completion_pairs(rows)


def test_prompt_ids_are_the_grpo_rendering_and_completion_ends_with_eos(tokenizer):
    pairs = prompt_completion_pairs(_rows())
    encoded = encode_examples(pairs, tokenizer)
    grpo = PromptSet([{"prompt": p.prompt, "task": p.task} for p in pairs], tokenizer)
    eos = tokenizer.eos_token_id
    for number, (pair, example) in enumerate(zip(pairs, encoded.examples, strict=True)):
        assert list(example.prompt_ids) == grpo.tokens(number)
        assert list(example.completion_ids) == [*tokenizer.encode(pair.completion,
                                                                  add_special_tokens=False), eos]
    # a chat prompt ends with the generation prompt, as in a GRPO rollout
    assert tokenizer.decode(list(encoded.examples[1].prompt_ids)).endswith(
        "<|im_start|>assistant\n")
    assert (encoded.truncated, encoded.dropped) == (0, 0)


def test_eos_already_present_is_not_doubled(tokenizer):
    pairs = prompt_completion_pairs([{"prompt": "a", "completion": "b<|im_end|>"}])
    (example,) = encode_examples(pairs, tokenizer).examples
    assert example.completion_ids.count(tokenizer.eos_token_id) == 1


def test_a_prompt_ending_in_an_open_assistant_turn_is_continued(tokenizer):
    prompt = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>"}]
    pairs = prompt_completion_pairs([{"prompt": prompt, "completion": "y</think>"}])
    (example,) = encode_examples(pairs, tokenizer).examples
    assert tokenizer.decode(list(example.prompt_ids)).endswith("<|im_start|>assistant\n<think>")


def test_max_prompt_length_cuts_prompts_as_the_grpo_prompt_set_does(tokenizer):
    pairs = prompt_completion_pairs(_rows())
    encoded = encode_examples(pairs, tokenizer, max_prompt_length=5)
    grpo = PromptSet([{"prompt": p.prompt, "task": p.task} for p in pairs], tokenizer,
                     max_prompt_length=5)
    for number, example in enumerate(encoded.examples):
        assert list(example.prompt_ids) == grpo.tokens(number)
        assert len(example.prompt_ids) == 5
    # the kept tokens are the last ones: a chat prompt still ends with the generation prompt
    assert tokenizer.decode(list(encoded.examples[1].prompt_ids)) == "tant\n"


def test_length_limit_truncates_drops_or_raises(tokenizer):
    # byte-level tokenizer: "abcdef" is 6 tokens, "xyz" 3 tokens + EOS = 4
    pairs = prompt_completion_pairs([
        {"prompt": "abcdef", "completion": "xyz"},  # 10 tokens
        {"prompt": "abcdefghij", "completion": "xyz"},  # prompt alone fills 10 tokens
        {"prompt": "ab", "completion": "xyz"},  # 6 tokens: fits
    ])
    truncated = encode_examples(pairs, tokenizer, max_length=8)
    assert [e.row for e in truncated.examples] == [0, 2]
    assert truncated.examples[0].completion_ids == tuple(tokenizer.encode("xy"))  # 6 + 2 = 8
    assert (truncated.truncated, truncated.dropped) == (1, 1)
    dropped = encode_examples(pairs, tokenizer, max_length=8, on_long_example="drop")
    assert [e.row for e in dropped.examples] == [2]
    with pytest.raises(ValueError, match=r"row 0 has 10 tokens .* max_length=8; raise"):
        encode_examples(pairs, tokenizer, max_length=8, on_long_example="error")
    with pytest.raises(ValueError, match="every example was dropped"):
        encode_examples(pairs[1:2], tokenizer, max_length=4)


def test_loss_mask_covers_exactly_the_completion_and_eos_for_text_and_chat(tokenizer):
    pairs = prompt_completion_pairs(_rows())
    examples = encode_examples(pairs, tokenizer).examples
    batch = collate_examples(examples, pad_token_id=tokenizer.pad_token_id)
    width = batch.target_length
    for row, (pair, example) in enumerate(zip(pairs, examples, strict=True)):
        targets = batch.input_ids[row, -width:][batch.target_mask[row]].tolist()
        assert tokenizer.decode(targets) == pair.completion + tokenizer.eos_token
        context = batch.input_ids[row, :-width][batch.attention_mask[row, :-width].bool()]
        assert context.tolist() == list(example.prompt_ids)
    # left-padded contexts (last context column real), right-padded targets
    assert bool(batch.attention_mask[:, -width - 1].bool().all())
    assert batch.num_target_tokens == sum(len(e.completion_ids) for e in examples)


def test_full_sequence_loss_scores_every_token_after_the_first(tokenizer):
    pairs = prompt_completion_pairs(_rows()[:2])
    examples = encode_examples(pairs, tokenizer).examples
    batch = collate_examples(examples, pad_token_id=0, completion_only_loss=False)
    for row, example in enumerate(examples):
        ids = list(example.prompt_ids + example.completion_ids)
        targets = batch.input_ids[row, -batch.target_length:][batch.target_mask[row]].tolist()
        assert targets == ids[1:]


def test_collate_against_a_loop_on_random_shapes():
    rng = random.Random(0)
    for _ in range(20):
        examples = [
            SFTExample(tuple(rng.randrange(1, 50) for _ in range(rng.randint(1, 7))),
                       tuple(rng.randrange(1, 50) for _ in range(rng.randint(1, 7))), row)
            for row in range(rng.randint(1, 5))
        ]
        batch = collate_examples(examples, pad_token_id=0)
        width_p = max(len(e.prompt_ids) for e in examples)
        width_l = max(len(e.completion_ids) for e in examples)
        assert tuple(batch.input_ids.shape) == (len(examples), width_p + width_l)
        for n, e in enumerate(examples):
            expected = ([0] * (width_p - len(e.prompt_ids)) + list(e.prompt_ids)
                        + list(e.completion_ids) + [0] * (width_l - len(e.completion_ids)))
            mask = ([0] * (width_p - len(e.prompt_ids)) + [1] * len(e.prompt_ids)
                    + [1] * len(e.completion_ids) + [0] * (width_l - len(e.completion_ids)))
            assert batch.input_ids[n].tolist() == expected
            assert batch.attention_mask[n].tolist() == mask
            assert batch.target_mask[n].tolist() == [bool(m) for m in mask[width_p:]]
        assert batch.target_mask.dtype == torch.bool
