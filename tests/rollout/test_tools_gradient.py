"""The tool mask in the loss: on a two-turn episode, the gradient of the GRPO loss equals the
gradient computed from a hand-built mask (the model's tokens of both turns, not the tool's
reply), with the reply attended to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from agent_helpers import ScriptedChat, call_text, multiply, tool_tokenizer, turn, user

from mtgrpo.policy import LossNormalizer, policy_loss, sequence_logprobs
from mtgrpo.rollout import SamplingParams
from mtgrpo.rollout.agent import ToolLoop, tool_reply_ids
from mtgrpo.trainer.update import pad_policy_batch
from tolerance import assert_close_f32

ADVANTAGES = torch.tensor([1.0, -0.5])  # [N]


def _episode(tokenizer: Any) -> Any:
    def script(prompt: str, j: int) -> str:
        if j == 1:
            return "No."
        return call_text("multiply", '{"a": 3, "b": 4}') if turn(prompt) == 0 else "12."

    loop = ToolLoop(ScriptedChat(tokenizer, script), tokenizer, max_completion_length=256)
    return loop.run([user("3*4?")] * 2, [[multiply]] * 2, SamplingParams(max_new_tokens=256),
                    group_size=2)


def _hand_mask(tokenizer: Any) -> list[list[int]]:
    """Rollout 0: its call (and EOS), the reply, its answer (and EOS); rollout 1: one turn."""
    def ids(text: str) -> list[int]:
        return [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]

    first = ids(call_text("multiply", '{"a": 3, "b": 4}'))
    reply = tool_reply_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}])
    return [[1] * len(first) + [0] * len(reply) + [1] * len(ids("12.")), [1] * len(ids("No."))]


def _gradients(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def test_the_loss_gradient_sees_only_the_models_tokens(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = tool_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    out = _episode(tokenizer)
    hand = _hand_mask(tokenizer)
    assert out.tool_mask == hand

    batch = pad_policy_batch(out.generation.prompt_ids, out.generation.completion_ids,
                             ADVANTAGES, tokenizer.pad_token_id, tool_masks=out.tool_mask)
    assert int(batch.completion_mask.sum()) == sum(map(len, hand))  # replies are attended
    scored = sequence_logprobs(model, batch.input_ids, batch.attention_mask,
                               batch.completion_length, temperature=1.0)
    loss = policy_loss(scored.logps, batch.advantages, batch.loss_mask, loss_type="dapo",
                       normalizer=LossNormalizer.for_batch(batch.loss_mask)).loss
    actual = _gradients(model, loss)

    # Reference: each row alone, unpadded, one plain forward; the dapo loss at ratio 1 has the
    # gradient of -sum(m A logp) / sum(m), m the hand-built mask.
    total, terms = sum(map(sum, hand)), []
    for i, mask in enumerate(hand):
        prompt, completion = out.generation.prompt_ids[i], out.generation.completion_ids[i]
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [L, V]
        logps = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        terms.append((torch.tensor(mask, dtype=torch.float32) * logps).sum() * ADVANTAGES[i])
    expected = _gradients(model, -torch.stack(terms).sum() / total)

    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        # gradients summed in another order (padded batch vs rows alone): 64 ulps; a reply
        # trained on, or not attended to, changes them by far more
        assert_close_f32(a, e, ulps=64)
