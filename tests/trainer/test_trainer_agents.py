"""The trainer with TRL's tools, environments and rollout_func on the tiny model: the tool
mask reaches the update, tool metrics per task, each environment a task, rollout_func's
extra fields reach the rewards."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import args

from mtgrpo import GRPOTrainer
from mtgrpo.models.chat_templates import TOOLS_CHATML_TEMPLATE


def _tokenizer(model_dir: Path) -> Any:
    """The tiny model's tokenizer with the tools template (the tools listed by name and
    arguments): the full schemas would not fit the tiny model's 512 positions (one token per
    byte)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = TOOLS_CHATML_TEMPLATE
    return tokenizer


class Counter:
    def reset(self, **row: Any) -> str:
        self.count = 0
        return " Count."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


class Echo:
    def reset(self, **row: Any) -> None:
        return None

    def shout(self, text: str) -> str:
        """Shout.

        Args:
            text: Text to shout.
        """
        return text.upper()


def shouted(completions: list[Any], **kwargs: Any) -> list[float]:
    return [float(any("HI" in str(m.get("content")) for m in c)) for c in completions]


def _scripted_generate(tokenizer: Any, choose_call: Any = None):
    """The first turn of every odd row calls the tool of its environment (``choose_call``
    reads it in the prompt and returns the call's JSON; by default the counter's
    ``increment`` or the echo's ``shout``); later turns answer."""
    if choose_call is None:
        def choose_call(prompt: str) -> str:
            return '{"name": "increment", "arguments": {"step": 2}}' if "Count." in prompt \
                else '{"name": "shout", "arguments": {"text": "hi"}}'

    def reply(row: int, prompt: str) -> str:
        return f"<tool_call>\n{choose_call(prompt)}\n</tool_call>" \
            if row % 2 and "<tool_response>" not in prompt else "ok"
    return _replying_generate(tokenizer, reply)


def _replying_generate(tokenizer: Any, reply: Any):
    """A stand-in for ``model.generate``: each row's next turn is ``reply(row, prompt_text)``,
    ended with EOS and padded."""
    def generate(input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        rows = [tokenizer(reply(r, tokenizer.decode(ids, skip_special_tokens=False)),
                          add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                for r, ids in enumerate(input_ids.tolist())]
        width = max(map(len, rows))
        padded = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(padded, device=input_ids.device)], dim=-1)
    return generate


def test_environments_train_as_tasks_with_the_tool_mask(tiny_model_dir: Path,
                                                        tmp_path: Path) -> None:
    from unittest.mock import patch

    tokenizer = _tokenizer(tiny_model_dir)
    data = [{"prompt": [{"role": "user", "content": f"Task {i}."}],
             "environment": "counter" if i % 2 else "echo"} for i in range(4)]
    trainer = GRPOTrainer(
        str(tiny_model_dir), shouted, args=args(tmp_path, max_completion_length=200,
                                       max_prompt_length=None, num_generations=2,
                                       prompts_per_step=2, max_steps=2),
        train_dataset=data, processing_class=tokenizer,
        environment_factory={"counter": Counter, "echo": Echo})
    assert trainer.task_names == ["counter", "echo"]
    assert trainer.reward_func_names == ["shouted", "Counter"]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    batches: list[Any] = []
    update = trainer.updater.update

    def spy(batch: Any, **kwargs: Any) -> Any:
        batches.append(batch)
        return update(batch, **kwargs)

    with patch.object(trainer.model, "generate", side_effect=_scripted_generate(tokenizer)), \
            patch.object(trainer.updater, "update", side_effect=spy):
        trainer.train()
    record = trainer.state.log_history[-2]
    assert record["tools/call_frequency"] == pytest.approx(0.5)
    assert record["tools/failure_frequency"] == 0.0
    logged = {key for r in trainer.state.log_history for key in r}
    for task in ("counter", "echo"):
        assert f"tasks/{task}/tool_call_frequency" in logged
    assert all(b.tool_mask is not None and (b.tool_mask == 0).any() for b in batches)
    # replies are attended (completion_mask) but not trained (loss_mask)
    assert all(int(b.loss_mask.sum()) < int(b.completion_mask.sum()) for b in batches)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_rollout_func_generates_and_its_extra_fields_reach_the_rewards(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    seen: list[Any] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        ids = trainer.processing_class(prompts, add_special_tokens=False)["input_ids"]
        eos = trainer.processing_class.eos_token_id
        completions = [[100 + i % 3, 101, eos] for i in range(len(prompts))]
        return {"prompt_ids": ids, "completion_ids": completions,
                "logprobs": [[-1.0] * 3 for _ in prompts],
                "env_mask": [[1, 0, 1] for _ in prompts],
                "score": [float(i % 3) for i in range(len(prompts))]}

    def reward(completions: list[Any], score: list[float], **kwargs: Any) -> list[float]:
        seen.append(score)
        return score

    trainer = GRPOTrainer(str(tiny_model_dir), reward,
                          args=args(tmp_path, num_generations=3, prompts_per_step=2),
                          train_dataset=[{"prompt": f"Say {i}:"} for i in range(4)],
                          rollout_func=rollout_func)
    trainer.train()
    assert seen
    assert seen[0] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    record = trainer.state.log_history[-2]
    assert record["completions/mean_length"] == 2.0  # the model's tokens only
    assert math.isfinite(record["loss"])


def test_rollout_func_with_tools_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not both"):
        GRPOTrainer(str(tiny_model_dir), lambda completions, **kw: [0.0] * len(completions),
                    args=args(tmp_path), train_dataset=[{"prompt": "x"}],
                    rollout_func=lambda prompts, trainer: {}, tools=[print])


def test_evaluation_runs_the_tool_loop(tiny_model_dir: Path, tmp_path: Path) -> None:
    from unittest.mock import patch

    tokenizer = _tokenizer(tiny_model_dir)
    data = [{"prompt": [{"role": "user", "content": f"Task {i}."}]} for i in range(2)]
    trainer = GRPOTrainer(
        str(tiny_model_dir), args=args(tmp_path, max_completion_length=200,
                                       max_prompt_length=None, num_generations=2,
                                       num_generations_eval=2, prompts_per_step=2),
        train_dataset=data, eval_dataset=data, processing_class=tokenizer,
        environment_factory=Counter)
    with patch.object(trainer.model, "generate", side_effect=_scripted_generate(tokenizer)):
        metrics = trainer.evaluate()
    # odd rows increment by 2: half the completions score 2
    assert metrics["eval_rewards/Counter/mean"] == pytest.approx(1.0)
    assert all(e.count in (0, 2) for e in trainer.environments)


def _environment_game_call(prompt: str) -> str:
    """The built-in environments' first call: the environment is read from the rules its
    reset appended to the prompt."""
    return '{"name": "calculate", "arguments": {"expression": "2 + 3"}}' \
        if "calculate tool" in prompt else '{"name": "guess", "arguments": {"number": 50}}'


def test_built_in_environments_train_as_tasks(tiny_model_dir: Path, tmp_path: Path) -> None:
    from unittest.mock import patch

    from mtgrpo.tasks.environments import CalculatorEnv, GuessTheNumberEnv

    tokenizer = _tokenizer(tiny_model_dir)
    data = [{"prompt": [{"role": "user", "content": f"Q{i}."}], "answer": "5", "secret": 50,
             "environment": "calculator" if i % 2 else "guess"} for i in range(4)]
    trainer = GRPOTrainer(
        str(tiny_model_dir), args=args(tmp_path, max_completion_length=200,
                                       max_prompt_length=None, num_generations=2,
                                       prompts_per_step=2, max_steps=2),
        train_dataset=data, processing_class=tokenizer,
        environment_factory={"calculator": CalculatorEnv, "guess": GuessTheNumberEnv})
    assert trainer.task_names == ["calculator", "guess"]
    assert trainer.reward_func_names == ["CalculatorEnv", "GuessTheNumberEnv"]
    with patch.object(trainer.model, "generate",
                      side_effect=_scripted_generate(tokenizer, _environment_game_call)):
        trainer.train()
    logged = {key for r in trainer.state.log_history for key in r}
    assert any(r.get("tools/call_frequency") == pytest.approx(0.5)
               for r in trainer.state.log_history)
    for task in ("calculator", "guess"):
        assert f"tasks/{task}/tool_call_frequency" in logged
    assert any(key.startswith("rewards/GuessTheNumberEnv") for key in logged)
    assert math.isfinite(trainer.state.log_history[-2]["loss"])
    # the guessing rollouts that called guess(50) found the secret
    assert any(isinstance(e, GuessTheNumberEnv) and e.found for e in trainer.environments)


# ---------------------------------------------------------------- hostile tools
def explode(text: str) -> str:
    """Raise.

    Args:
        text: Anything.
    """
    raise RuntimeError("the tool broke")


def hang(seconds: int) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    import time

    time.sleep(seconds)
    return "woke"


def flood(size: int) -> str:
    """A huge reply.

    Args:
        size: Characters.
    """
    return "x" * size


def python(code: str) -> str:
    """Run Python in the sandbox.

    Args:
        code: The program.
    """
    from mtgrpo.tasks.environments import PythonEnv

    return PythonEnv().python(code)


HOSTILE_CALLS = [
    '{"name": "explode", "arguments": {"text": "a"}}',
    '{"name": "hang", "arguments": {"seconds": 60}}',
    '{"name": "flood", "arguments": {"size": 1000000}}',
    'this is not JSON',
    '{"name": "python", "arguments": {"code": "print(open(\'/etc/passwd\').read())"}}',
    '{"name": "python", "arguments": {"code": "import os\\nwhile True:\\n    os.fork()"}}',
    '{"name": "no_such_tool", "arguments": {}}',
    '{"name": "explode", "arguments": {"wrong": 1}}',
]


def leaked(completions: list[Any], **kwargs: Any) -> list[float]:
    """The forged reward a hostile rollout would want: 1 if a tool reply leaked a secret."""
    return [float(any("root:" in str(m.get("content")) for m in c)) for c in completions]


def test_hostile_tools_are_failures_and_training_goes_on(tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    """Raising, hanging, huge-output, malformed and sandbox-escaping calls: each answered
    (an error the model reads, a rolled-back reply or the rollout's end), none stops the run,
    none leaks what the sandbox keeps out, and the trainer's process is untouched."""
    import os
    import time
    from unittest.mock import patch

    tokenizer = _tokenizer(tiny_model_dir)
    calls = iter(HOSTILE_CALLS * 4)

    def reply(row: int, prompt: str) -> str:
        return "done" if "<tool_response>" in prompt else \
            f"<tool_call>\n{next(calls, HOSTILE_CALLS[0])}\n</tool_call>"

    generate = _replying_generate(tokenizer, reply)

    data = [{"prompt": [{"role": "user", "content": f"Task {i}."}]} for i in range(8)]
    trainer = GRPOTrainer(
        str(tiny_model_dir), leaked,
        args=args(tmp_path, max_completion_length=300, max_prompt_length=None,
                  num_generations=2, prompts_per_step=4, max_steps=2, tool_call_timeout=1.0),
        train_dataset=data, processing_class=tokenizer, tools=[explode, hang, flood, python])
    pid, cwd = os.getpid(), os.getcwd()
    begin = time.monotonic()
    with patch.object(trainer.model, "generate", side_effect=generate):
        trainer.train()
    assert time.monotonic() - begin < 60  # the 60 s sleeps were cut at tool_call_timeout
    assert (os.getpid(), os.getcwd()) == (pid, cwd)
    assert trainer.state.global_step == 2
    records = [r for r in trainer.state.log_history
               if "tools/call_frequency" in r and "train_loss" not in r]
    assert len(records) == 2
    assert all(r["tools/call_frequency"] == 1.0 for r in records)  # every rollout called
    # each step's 8 rollouts make the 8 calls: the raising, hanging, malformed, unknown-tool
    # and bad-argument ones fail; the flood is rolled back; the sandbox answers the escapes
    assert all(r["tools/failure_frequency"] == pytest.approx(5 / 8) for r in records)
    assert all(r["rewards/leaked/mean"] == 0.0 for r in records)  # nothing forged
    rollouts = [json.loads(line) for line in
                (tmp_path / "completions.jsonl").read_text().splitlines()] \
        if (tmp_path / "completions.jsonl").is_file() else []
    assert not any("root:" in json.dumps(r) for r in rollouts)


def test_malformed_tool_calls_reply_answers_them_with_the_parse_error(tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    """``malformed_tool_calls="reply"``: the malformed call is answered (the model reads the
    parse error and takes another turn) and counts as a failure; "end" (TRL's rule, the
    default) stops the rollout there."""
    from unittest.mock import patch

    tokenizer = _tokenizer(tiny_model_dir)
    data = [{"prompt": [{"role": "user", "content": f"Task {i}."}]} for i in range(4)]
    turns: dict[str, int] = {}
    for policy in ("reply", "end"):
        def reply(row: int, prompt: str, policy: str = policy) -> str:
            turns[policy] = turns.get(policy, 0) + 1
            return "done" if "<tool_response>" in prompt else "<tool_call>\nnot JSON\n</tool_call>"

        trainer = GRPOTrainer(
            str(tiny_model_dir), leaked,
            args=args(tmp_path / policy, max_completion_length=300, max_prompt_length=None,
                      num_generations=2, prompts_per_step=2, max_steps=1,
                      malformed_tool_calls=policy),
            train_dataset=data, processing_class=tokenizer, tools=[explode])
        with patch.object(trainer.model, "generate",
                          side_effect=_replying_generate(tokenizer, reply)):
            trainer.train()
        record = trainer.state.log_history[0]
        assert record["tools/call_frequency"] == 1.0
        assert record["tools/failure_frequency"] == 1.0
    # 4 rollouts: one turn each under "end", a second turn after the error reply under "reply"
    assert (turns["end"], turns["reply"]) == (4, 8)
    with pytest.raises(ValueError, match=r"malformed_tool_calls='ignore' must be one of end, "
                       r"reply"):
        args(tmp_path, malformed_tool_calls="ignore")


def test_without_train_dataset_an_epoch_is_one_generation_round(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    """TRL 1.16 builds generation_batch_size // num_generations placeholder rows (one
    generation round), so every training step is one epoch; a count from
    per_device_train_batch_size made a step with fewer prompts (prompts_per_step: 1) a
    fraction of an epoch (logged epoch 0.5, epoch strategies every other step)."""
    from unittest.mock import patch

    tokenizer = _tokenizer(tiny_model_dir)
    trainer = GRPOTrainer(
        str(tiny_model_dir), shouted, args=args(tmp_path, max_completion_length=200,
                                       max_prompt_length=None, num_generations=2,
                                       per_device_train_batch_size=4, prompts_per_step=1,
                                       max_steps=2),
        processing_class=tokenizer, environment_factory=Counter)
    assert len(trainer.train_dataset) == trainer.prompts_per_step == 1
    with patch.object(trainer.model, "generate", side_effect=_scripted_generate(tokenizer)):
        trainer.train()
    epochs = [r["epoch"] for r in trainer.state.log_history if "train_runtime" not in r]
    assert epochs == [1.0, 2.0]
