# ruff: noqa
# TRL's GRPO tests of tool calling and environments, run against mtgrpo with only the import
# changed.
#
# Source: huggingface/trl tests/test_grpo_trainer.py at commit
# f2cd57710ae345ea6428ae95363267fcf38a3dc8 (2026-07-24, VERSION 1.10.0.dev0), the newest
# revision of the file available here (the v1.16.0 tag is not in the stored snapshot and TRL's
# sdist ships no tests); the same revision as test_trl_grpo_trainer.py, whose header lists the
# other cases. Ported here: TestGRPORolloutDispatch (`rollout_func`) and TestGRPOTrainer's tool
# and environment cases, verbatim, in TRL's order.
#
# The one change: `from trl import GRPOConfig, GRPOTrainer` became
# `from mtgrpo import GRPOConfig, GRPOTrainer`. The hub models and the zen dataset are the local
# stand-ins of tests/compat/standins.py; these cases get the stand-ins with Qwen's full
# vocabulary (conftest.py: FULL_VOCABULARY), whose tokenizer holds `<tool_call>`, `</tool_call>`
# and the Qwen2.5 tokens these tests write completions with, at their real ids, and whose chat
# template renders tools as Qwen2.5's does. `require_jmespath` does not skip here
# (testing_utils.py): jmespath is TRL's legacy response parser's dependency, and mtgrpo parses
# tool calls itself.
#
# Left out (test case: reason):
#   TestGRPOTrainer.test_train_with_multiple_environments: its scripted completions assume TRL's
#     sequential batch layout, every batch [counter, counter, echo, echo]; mtgrpo makes each
#     environment a task (the dataset has no task column) and draws each batch's tasks from
#     the task weights (`batch_construction`), so a batch may hold two counter groups, whose
#     rollouts then call `shout`, which only the echo environment has. Routing each rollout to
#     its environment's own tools is tested in tests/rollout/test_tools.py
#     (test_the_worker_scores_tool_rollouts_and_counts_calls_per_task)
#   TestGRPOTrainerVLM.test_train_with_tools_multimodal_response: vision-language models
#
# Copyright 2020-2026 The HuggingFace Team (the test code below); licensed under the Apache
# License, Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0).

# Copyright 2020-2026 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

import os
from collections.abc import Callable
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import pytest
import torch
import transformers
from datasets import Dataset, load_dataset
from packaging.version import Version

from mtgrpo import GRPOConfig, GRPOTrainer

from .testing_utils import TrlTestCase, require_jmespath


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_multiply_tool(a: int, b: int) -> int:
    """
    Asynchronously multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


class TestGRPORolloutDispatch:
    def _make_trainer(self):
        trainer = object.__new__(GRPOTrainer)
        trainer.accelerator = SimpleNamespace(
            device=torch.device("cpu"),
            is_main_process=True,
            gather=lambda t: t,
        )
        trainer.args = SimpleNamespace(report_to=[])
        trainer.model = SimpleNamespace(training=True)
        trainer.state = SimpleNamespace(global_step=2, num_input_tokens_seen=0)
        trainer._last_loaded_step = 1
        trainer.use_vllm = False
        trainer.use_transformers_continuous_batching = False
        trainer.vllm_generation = SimpleNamespace(sync_weights=MagicMock())
        trainer.processing_class = SimpleNamespace(
            batch_decode=MagicMock(return_value=["decoded"]),
        )
        trainer._tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=0)
        trainer.tools = None
        trainer._metrics = {
            "train": {
                "num_tokens": [],
                **{
                    k: []
                    for k in [
                        "completions/mean_length",
                        "completions/min_length",
                        "completions/max_length",
                        "completions/clipped_ratio",
                        "completions/mean_terminated_length",
                        "completions/min_terminated_length",
                        "completions/max_terminated_length",
                    ]
                },
            }
        }
        return trainer

    def test_generate_prefers_rollout_func(self):
        trainer = self._make_trainer()
        trainer.rollout_func = MagicMock(
            return_value={
                "prompt_ids": [[1]],
                "completion_ids": [[2]],
                "logprobs": [[-0.1]],
                "env_mask": [[1]],
            }
        )

        result = trainer._generate(["prompt"])

        assert result[0] == [[1]]  # prompt_ids
        assert result[1] == [[2]]  # completion_ids
        assert result[2] == [[1]]  # tool_mask (from env_mask)
        trainer.rollout_func.assert_called_once_with(["prompt"], trainer)

    def test_generate_rollout_func_syncs_vllm_weights_when_needed(self):
        trainer = self._make_trainer()
        trainer.use_vllm = True
        trainer.rollout_func = MagicMock(
            return_value={"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[0.0]]}
        )

        trainer._generate(["prompt"])

        trainer.vllm_generation.sync_weights.assert_called_once()
        assert trainer._last_loaded_step == trainer.state.global_step
        trainer.rollout_func.assert_called_once_with(["prompt"], trainer)

    def test_generate_rollout_func_raises_when_required_keys_are_missing(self):
        trainer = self._make_trainer()
        trainer.rollout_func = MagicMock(return_value={"prompt_ids": [[1]], "completion_ids": [[2]]})

        with pytest.raises(ValueError, match="rollout_func must return keys"):
            trainer._generate(["prompt"])


class TestGRPOTrainer(TrlTestCase):
    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.0.0"),
        reason="Tool parsing is not supported in transformers versions below 5.0.0",
        strict=True,
    )
    @require_jmespath
    @pytest.mark.parametrize("tools", [[multiply_tool], [async_multiply_tool]])
    def test_train_with_tools(self, tools: list[Callable]):
        # In this test, we define a simple tool that multiplies two integers. Regardless of the input prompt,
        # the model will generate 3 completions, 2 of which will be valid tool calls. Among the 2 tool calls, one will
        # succeed and the other will fail (because of a wrong argument name).

        dataset = load_dataset("trl-internal-testing/zen", "conversational_prompt_only", split="train")

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            max_completion_length=128,
            report_to="none",
        )
        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5",
            args=training_args,
            train_dataset=dataset,
            tools=tools,
        )

        previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}
        tool_name = tools[0].__name__

        def fake_generate(input_ids, **kwargs):
            if input_ids.shape[0] == 3:  # first call
                # fmt: off
                if tool_name == "multiply_tool":
                    completion_ids = torch.tensor(
                        [
                            # '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
                            [151657, 198, 4913, 606, 788, 330, 64648, 22785, 497, 330, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 65, 788, 220, 19, 11248, 151658, 151645],
                            # an invalid tool call with wrong argument name
                            # '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call><|im_end|>'
                            [151657, 198, 4913, 606, 788, 330, 64648, 22785, 497, 330, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 66, 788, 220, 19, 11248, 151658, 151645],
                            # "I don't know any tool<|im_end|>"
                            [40, 1513, 944, 1414, 894, 5392, 151645, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643],
                        ],
                        device=input_ids.device,
                    )
                elif tool_name == "async_multiply_tool":
                    completion_ids = torch.tensor(
                        [
                            # '<tool_call>\n{"name": "async_multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
                            [151657, 198, 4913, 606, 788, 330, 7692, 93054, 22785, 497, 330, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 65, 788, 220, 19, 11248, 151658, 151645],
                            # an invalid tool call with wrong argument name
                            # '<tool_call>\n{"name": "async_multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call><|im_end|>'
                            [151657, 198, 4913, 606, 788, 330, 7692, 93054, 22785, 497, 330, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 66, 788, 220, 19, 11248, 151658, 151645],
                            # "I don't know any tool<|im_end|>"
                            [40, 1513, 944, 1414, 894, 5392, 151645, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643],
                        ],
                        device=input_ids.device,
                    )
                # fmt: on
            else:  # second call will only have two inputs in the batch, because two examples have a tool call.
                completion_ids = torch.tensor(
                    [
                        # 'Done!<|im_end|>'
                        [17453, 0, 151645],
                        # 'Done!<|im_end|>'
                        [17453, 0, 151645],
                    ],
                    device=input_ids.device,
                )
            return torch.cat([input_ids, completion_ids], dim=-1)

        with patch.object(trainer.model, "generate", side_effect=fake_generate):
            trainer.train()

        assert trainer.state.log_history[-1]["train_loss"] is not None
        assert trainer.state.log_history[-1]["tools/call_frequency"] is not None
        assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 3)
        assert trainer.state.log_history[-1]["tools/failure_frequency"] is not None
        assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(1 / 2)

        # Check that the params have changed
        for n, param in previous_trainable_params.items():
            new_param = trainer.model.get_parameter(n)
            assert not torch.equal(param, new_param), f"Parameter {n} has not changed."

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_train_with_unknown_environment_raises(self):
        # With a dict `environment_factory`, an example whose `environment` field doesn't match any configured
        # environment should fail with a clear error rather than a bare KeyError mid-rollout.
        dataset = load_dataset("trl-internal-testing/zen", "conversational_prompt_only", split="train")
        dataset = dataset.map(lambda example: {"environment": "unknown"})

        class CounterEnvironment:
            def reset(self, **kwargs): ...

            def increment(self, step: int) -> int:
                """
                Increment the internal counter.

                Args:
                    step: Value to add to the counter.

                Returns:
                    The updated counter value.
                """
                return step

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            report_to="none",
        )

        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5",
            args=training_args,
            train_dataset=dataset,
            environment_factory={"counter": CounterEnvironment},
        )

        with pytest.raises(ValueError, match="not among the environments"):
            trainer.train()

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_train_with_environment_factory(self):
        # In this test, we define a simple tool that increments an internal counter. Regardless of the input prompt,
        # the model will generate 3 completions, 2 of which will be valid tool calls. Among the 2 tool calls, one will
        # succeed and the other will fail (because of a wrong tool name).
        class DummyEnvironment:
            def reset(self, **kwargs):
                self._counter = 0

            def increment(self, step: int) -> int:
                """
                Increment the internal counter.

                Args:
                    step: Value to add to the counter.

                Returns:
                    The updated counter value.
                """
                self._counter += step
                return self._counter

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            max_steps=5,  # required with environment_factory
            report_to="none",
        )

        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5",
            args=training_args,
            environment_factory=DummyEnvironment,
        )

        previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

        def fake_generate(input_ids, **kwargs):
            if input_ids.shape[0] == 3:  # first call
                # fmt: off
                completion_ids = torch.tensor(
                    [
                        # '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>'
                        [151657, 198, 4913, 606, 788, 330, 35744, 497, 330, 16370, 788, 5212, 9520, 788, 220, 16, 11248, 151658, 151645, 151643],
                        # an invalid tool call with wrong tool name
                        # '<tool_call>\n{"name": "decrement", "arguments": {"step": 2}}\n</tool_call><|im_end|>'
                        [151657, 198, 4913, 606, 788, 330, 450, 13477, 497, 330, 16370, 788, 5212, 9520, 788, 220, 17, 11248, 151658, 151645],
                        # "I won't increment<|im_end|>"
                        [40, 2765, 944, 16252, 151645, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643],
                    ],
                    device=input_ids.device,
                )
                # fmt: on
            else:  # second call will only have two inputs in the batch, because two examples have a tool call.
                completion_ids = torch.tensor(
                    [
                        # 'Done!<|im_end|>'
                        [17453, 0, 151645],
                        # 'Done!<|im_end|>'
                        [17453, 0, 151645],
                    ],
                    device=input_ids.device,
                )
            return torch.cat([input_ids, completion_ids], dim=-1)

        with patch.object(trainer.model, "generate", side_effect=fake_generate):
            trainer.train()

        assert trainer.state.log_history[-1]["train_loss"] is not None
        assert trainer.state.log_history[-1]["tools/call_frequency"] is not None
        assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 3)
        assert trainer.state.log_history[-1]["tools/failure_frequency"] is not None
        assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(1 / 2)

        # Check the states of the environment
        assert trainer.environments[0]._counter == 1  # should have been incremented once
        assert trainer.environments[1]._counter == 0  # shouldn't have been incremented because the tool call failed
        assert trainer.environments[2]._counter == 0  # shouldn't have been incremented because no tool call was made

        # Check that the params have changed
        for n, param in previous_trainable_params.items():
            new_param = trainer.model.get_parameter(n)
            assert not torch.equal(param, new_param), f"Parameter {n} has not changed."

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_train_with_environment_owned_reward(self):
        # Same setup as `test_train_with_environment_factory`, but the environment owns the reward via a `get_reward`
        # method and no `reward_funcs` is passed. The reward equals the final counter, so the 3 generations
        # (counters 1, 0, 0) get rewards 1.0, 0.0, 0.0.

        class DummyEnvironment:
            def reset(self, **kwargs):
                self._counter = 0

            def increment(self, step: int) -> int:
                """
                Increment the internal counter.

                Args:
                    step: Value to add to the counter.

                Returns:
                    The updated counter value.
                """
                self._counter += step
                return self._counter

            def get_reward(self) -> float:
                return float(self._counter)

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            max_steps=5,  # required with environment_factory
            report_to="none",
        )

        # No `reward_funcs`: the reward is supplied entirely by the environment.
        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            args=training_args,
            environment_factory=DummyEnvironment,
        )

        # The env-owned reward is registered as the sole reward source (logged under the env class name) with weight 1,
        # and `get_reward` is not exposed as a tool.
        assert trainer.reward_func_names == ["DummyEnvironment"]
        assert trainer.reward_weights.tolist() == [1.0]
        tool_names = [tool.__name__ for tool in trainer.tools]
        assert "increment" in tool_names
        assert "get_reward" not in tool_names
        assert "reset" not in tool_names

        previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

        def fake_generate(input_ids, **kwargs):
            if input_ids.shape[0] == 3:  # first call
                # fmt: off
                completion_ids = torch.tensor(
                    [
                        # '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>'
                        [151657, 198, 4913, 606, 788, 330, 35744, 497, 330, 16370, 788, 5212, 9520, 788, 220, 16, 11248, 151658, 151645, 151643],
                        # an invalid tool call with wrong tool name
                        # '<tool_call>\n{"name": "decrement", "arguments": {"step": 2}}\n</tool_call><|im_end|>'
                        [151657, 198, 4913, 606, 788, 330, 450, 13477, 497, 330, 16370, 788, 5212, 9520, 788, 220, 17, 11248, 151658, 151645],
                        # "I won't increment<|im_end|>"
                        [40, 2765, 944, 16252, 151645, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643, 151643],
                    ],
                    device=input_ids.device,
                )
                # fmt: on
            else:  # second call will only have two inputs in the batch, because two examples have a tool call.
                completion_ids = torch.tensor(
                    [
                        # 'Done!<|im_end|>'
                        [17453, 0, 151645],
                        # 'Done!<|im_end|>'
                        [17453, 0, 151645],
                    ],
                    device=input_ids.device,
                )
            return torch.cat([input_ids, completion_ids], dim=-1)

        with patch.object(trainer.model, "generate", side_effect=fake_generate):
            trainer.train()

        # The environment-owned reward is logged like any reward func, under the env class name. Counters are 1, 0, 0
        # -> rewards 1.0, 0.0, 0.0.
        assert trainer.state.log_history[-1]["rewards/DummyEnvironment/mean"] == pytest.approx(1 / 3)

        # Check that the params have changed
        for n, param in previous_trainable_params.items():
            new_param = trainer.model.get_parameter(n)
            assert not torch.equal(param, new_param), f"Parameter {n} has not changed."

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_environment_owned_reward_coexists_with_reward_funcs(self):
        # When both `reward_funcs` and an environment-owned `get_reward` are present, `get_reward` is appended as an
        # extra reward source (weight 1) after the trainer-owned reward functions.
        class DummyEnvironment:
            def reset(self, **kwargs):
                self._solved = False

            def guess(self, word: str) -> str:
                """
                Submit a guess.

                Args:
                    word: The guessed word.

                Returns:
                    Feedback about the guess.
                """
                return "nope"

            def get_reward(self) -> float:
                return 1.0 if self._solved else 0.0

        def format_reward(completions, **kwargs):
            return [0.0 for _ in completions]

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            max_steps=5,  # required with environment_factory
            reward_weights=[0.5],  # weight only applies to the trainer-owned reward func
            report_to="none",
        )
        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            reward_funcs=format_reward,
            args=training_args,
            environment_factory=DummyEnvironment,
        )

        # The env-owned reward is appended after the trainer-owned reward func (logged under the env class name), with
        # a fixed weight of 1.
        assert trainer.reward_func_names == ["format_reward", "DummyEnvironment"]
        assert trainer.reward_weights.tolist() == [0.5, 1.0]
        assert len(trainer.reward_funcs) == 2
        # `get_reward` is not exposed as a tool; `guess` is.
        tool_names = [tool.__name__ for tool in trainer.tools]
        assert "guess" in tool_names
        assert "get_reward" not in tool_names

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_environment_owned_reward_mixed_environments(self):
        # With a dict `environment_factory`, only some environments may own their reward via `get_reward`. Each such
        # env *class* contributes one reward column (named after its class); a rollout is scored only when its
        # environment is that class, so mixing a reward-owning env with a plain one must not raise. Reward columns are
        # deduplicated by class: two names mapping to the same `get_reward` class share a single column (no
        # double-counting).
        class ScoredEnvironment:  # owns its reward
            def reset(self, **kwargs): ...

            def act(self, x: int) -> int:
                """
                Act.

                Args:
                    x: A value.

                Returns:
                    The value.
                """
                return x

            def get_reward(self) -> float:
                return 1.0

        class PlainEnvironment:  # no `get_reward`; scored by `reward_funcs`
            def reset(self, **kwargs): ...

            def play(self, x: int) -> int:
                """
                Play.

                Args:
                    x: A value.

                Returns:
                    The value.
                """
                return x

        def format_reward(completions, **kwargs):
            return [0.0 for _ in completions]

        # A dict `environment_factory` routes each example via its `environment` column, so a dataset is required.
        dataset = Dataset.from_dict({"environment": ["scored", "scored2", "plain"]})

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            report_to="none",
        )
        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            reward_funcs=format_reward,
            args=training_args,
            train_dataset=dataset,
            # `scored` and `scored2` both build `ScoredEnvironment`, so they must collapse to a single reward column.
            environment_factory={"scored": ScoredEnvironment, "scored2": ScoredEnvironment, "plain": PlainEnvironment},
        )

        # Only `ScoredEnvironment` owns a reward, and despite two names mapping to it, a single (deduplicated) env-reward
        # column is appended after the trainer-owned reward func, with a fixed weight of 1.
        assert trainer.reward_func_names == ["format_reward", "ScoredEnvironment"]
        assert trainer.reward_weights.tolist() == [1.0, 1.0]

        # The env-reward func scores only rollouts bound to `ScoredEnvironment`; a `PlainEnvironment` rollout returns
        # `None` (turned into NaN and ignored) instead of raising `AttributeError`.
        env_reward_func = trainer.reward_funcs[-1]
        rewards = env_reward_func(environments=[ScoredEnvironment(), PlainEnvironment()])
        assert rewards == [1.0, None]

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_environment_owned_data_requires_max_steps(self):
        # When the environment owns the data and no external `train_dataset` is provided, `max_steps` must set the
        # training length.
        class DummyEnvironment:
            def reset(self, **kwargs):
                return "Guess the 5-letter word."

        training_args = GRPOConfig(output_dir=self.tmp_dir, report_to="none")  # max_steps unset
        with pytest.raises(ValueError, match="max_steps"):
            GRPOTrainer(
                model="trl-internal-testing/tiny-Qwen3ForCausalLM",
                reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5",
                args=training_args,
                environment_factory=DummyEnvironment,
            )

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_multiple_environments_without_dataset_raises(self):
        # Multiple environments (a `dict` factory) need a `train_dataset` with an `environment` column to route each
        # example. Without one, there is no per-rollout selector, so construction fails fast with a clear message.
        class EnvA:
            def reset(self, **kwargs): ...

        class EnvB:
            def reset(self, **kwargs): ...

        training_args = GRPOConfig(output_dir=self.tmp_dir, max_steps=1, report_to="none")
        with pytest.raises(ValueError, match="requires a `train_dataset`"):
            GRPOTrainer(
                model="trl-internal-testing/tiny-Qwen3ForCausalLM",
                reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5",
                args=training_args,
                environment_factory={"a": EnvA, "b": EnvB},
            )

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.2.0"),
        reason="Environment factory support is not available in transformers versions below 5.2.0",
        strict=True,
    )
    @require_jmespath
    @patch.dict(os.environ, {"TRL_EXPERIMENTAL_SILENCE": "1"})
    def test_train_with_environment_owned_data(self):
        # The environment owns the data — no external `train_dataset` is needed. `reset()` returns the prompt, and
        # `max_steps` drives the training loop. A placeholder dataset is built internally.
        class GuessTheWordEnvironment:
            def reset(self, **kwargs):
                return "Guess the 5-letter word."  # the env owns the data and returns the prompt

        # Distinct-length completions within the group give reward variance, so advantages are non-zero.
        def fake_generate(input_ids, **kwargs):
            rows = [
                [17453, 0, 151645, 151643, 151643, 151643],  # 'Done!' + eos + pad
                [17453, 17453, 0, 151645, 151643, 151643],  # 'DoneDone!' + eos + pad
                [17453, 17453, 17453, 0, 151645, 151643],  # 'DoneDoneDone!' + eos + pad
            ]
            completion_ids = torch.tensor([rows[i % 3] for i in range(input_ids.shape[0])], device=input_ids.device)
            return torch.cat([input_ids, completion_ids], dim=-1)

        def reward_len(completions, **kwargs):
            return [float(len(completion[-1]["content"])) for completion in completions]

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            max_steps=5,  # the environment owns the data, so `max_steps` sets the training length
            max_completion_length=8,  # reduce the completion length to reduce memory usage
            report_to="none",
        )

        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3ForCausalLM",
            reward_funcs=reward_len,
            args=training_args,
            environment_factory=GuessTheWordEnvironment,
        )

        previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

        with patch.object(trainer.model, "generate", side_effect=fake_generate):
            trainer.train()

        assert trainer.state.log_history[-1]["train_loss"] is not None

        # Check that the params have changed
        for n, param in previous_trainable_params.items():
            new_param = trainer.model.get_parameter(n)
            assert not torch.equal(param, new_param), f"Parameter {n} has not changed."

    @pytest.mark.xfail(
        condition=Version(transformers.__version__) < Version("5.0.0"),
        reason="Tool parsing is not supported in transformers versions below 5.0.0",
        strict=True,
    )
    @require_jmespath
    def test_train_with_malformed_tool_calls(self):
        dataset = load_dataset("trl-internal-testing/zen", "conversational_prompt_only", split="train")

        training_args = GRPOConfig(
            output_dir=self.tmp_dir,
            learning_rate=0.1,  # use higher lr because gradients are tiny and default lr can stall updates
            per_device_train_batch_size=3,  # reduce the batch size to reduce memory usage
            num_generations=3,  # reduce the number of generations to reduce memory usage
            max_completion_length=128,
            report_to="none",
        )
        trainer = GRPOTrainer(
            model="trl-internal-testing/tiny-Qwen3MoeForCausalLM",
            reward_funcs="trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5",
            args=training_args,
            train_dataset=dataset,
            tools=[multiply_tool],
        )

        previous_trainable_params = {n: param.clone() for n, param in trainer.model.named_parameters()}

        def fake_generate(input_ids, **kwargs):
            # If input_ids.shape[0] < 3, it means that it's a second call, which should not happen here
            assert input_ids.shape[0] == 3
            # fmt: off
            completion_ids = torch.tensor(
                [
                    # '<tool_call>\n{"arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
                    [151657, 198, 4913, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 65, 788, 220, 19, 11248, 151658, 151645, 151643, 151643, 151643, 151643, 151643],
                    # '<toolcall>\n{"arguments": {"a": 3, "b": 4}}\n</toolcall><|im_end|>'
                    [27, 14172, 6659, 397, 4913, 16370, 788, 5212, 64, 788, 220, 18, 11, 330, 65, 788, 220, 19, 11248, 522, 14172, 6659, 29, 151645],
                    # '<tool_call>\n{"arguments": {a: 3, b: 4}}\n</tool_call><|im_end|>'
                    [151657, 198, 4913, 16370, 788, 314, 64, 25, 220, 18, 11, 293, 25, 220, 19, 11248, 151658, 151645, 151643, 151643, 151643, 151643, 151643, 151643],
                ],
                device=input_ids.device,
            )
            # fmt: on
            return torch.cat([input_ids, completion_ids], dim=-1)

        with patch.object(trainer.model, "generate", side_effect=fake_generate):
            trainer.train()

        assert trainer.state.log_history[-1]["train_loss"] is not None

        # Check that the params have changed
        for n, param in previous_trainable_params.items():
            new_param = trainer.model.get_parameter(n)
            assert not torch.equal(param, new_param), f"Parameter {n} has not changed."
