"""The multi-turn tool loop: parsing, running tools, failures, time limits, budgets, the mask."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agent_helpers import ScriptedChat, call_text, multiply, tool_tokenizer, turn, user

from mtgrpo.rollout import SamplingParams
from mtgrpo.rollout.agent import (
    Environments,
    ToolCall,
    ToolLoop,
    parse_hermes_tool_calls,
    run_tool_calls,
    tool_reply_ids,
)

PARAMS = SamplingParams(max_new_tokens=512)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tool_tokenizer()


def _loop(tokenizer: Any, script: Any, **options: Any) -> tuple[ToolLoop, ScriptedChat]:
    backend = ScriptedChat(tokenizer, script, logprob=options.pop("logprob", None))
    options.setdefault("max_completion_length", 1024)
    return ToolLoop(backend, tokenizer, **options), backend


# ---------------------------------------------------------------------------------- parsing
def test_parse_reads_calls_in_order_and_removes_them_from_the_content() -> None:
    text = ("Let me compute. " + call_text("multiply", '{"a": 3, "b": 4}') + "\n"
            + call_text("add", '"{\\"x\\": 1}"'))
    parsed = parse_hermes_tool_calls(text)
    assert parsed.content == "Let me compute."
    assert parsed.calls == (ToolCall("multiply", {"a": 3, "b": 4}), ToolCall("add", {"x": 1}))
    message = parsed.message()
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["multiply", "add"]


@pytest.mark.parametrize(("body", "reason"), [
    ('{"arguments": {"a": 3}}', "no name"),
    ('{"arguments": {a: 3, b: 4}}', "not valid JSON"),
    ('["multiply"]', "JSON object"),
    ('{"name": "multiply", "arguments": [3, 4]}', "must be a JSON object"),
])
def test_parse_keeps_a_malformed_call_with_its_reason(body: str, reason: str) -> None:
    (call,) = parse_hermes_tool_calls(f"<tool_call>\n{body}\n</tool_call>").calls
    assert call.malformed
    assert reason in (call.error or "")


def test_parse_without_calls_keeps_the_text_and_reads_an_unclosed_block() -> None:
    assert parse_hermes_tool_calls("<toolcall>{}</toolcall> done").calls == ()
    assert parse_hermes_tool_calls("<toolcall>{}</toolcall> done").content == \
        "<toolcall>{}</toolcall> done"
    (call,) = parse_hermes_tool_calls('<tool_call>{"name": "f", "arguments": {}}').calls
    assert call == ToolCall("f", {})


# ---------------------------------------------------------------------------------- execution
def _run(calls: list[ToolCall], tools: dict[str, Any], timeout: float = 5.0) -> list[Any]:
    return run_tool_calls([calls], [tools], timeout=timeout)[0]


def test_a_failing_call_becomes_an_error_message_and_never_an_exception() -> None:
    def broken(x: int) -> int:
        """Fails.

        Args:
            x: anything
        """
        raise RuntimeError("disk on fire")

    results = _run([ToolCall("nope", {}), ToolCall("multiply", {"a": 1, "c": 2}),
                    ToolCall("broken", {"x": 1}), ToolCall(None, error="the tool call has no name"),
                    ToolCall("multiply", {"a": 2, "b": 5})],
                   {"multiply": multiply, "broken": broken})
    assert [r.failed for r in results] == [True, True, True, True, False]
    assert results[0].content == "Error: unknown tool 'nope'"
    assert results[1].content == "Error: missing a required argument: 'b'"
    assert "RuntimeError: disk on fire" in results[2].content
    assert "no name" in results[3].content
    assert results[4].content == "10"
    assert results[4].message() == \
        {"role": "tool", "name": "multiply", "content": "10"}


def test_sync_and_async_tools_are_cut_at_their_time_limit() -> None:
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return "late"

    async def slow_async(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "late"

    begin = time.perf_counter()
    results = _run([ToolCall("slow", {"seconds": 2.0}), ToolCall("slow_async", {"seconds": 2.0}),
                    ToolCall("slow_async", {"seconds": 0.0})],
                   {"slow": slow, "slow_async": slow_async}, timeout=0.2)
    assert time.perf_counter() - begin < 1.5  # neither waited for its tool
    assert [r.failed for r in results] == [True, True, False]
    assert results[0].content == "Error: slow timed out after 0.2 s"
    assert results[2].content == "late"


def test_rollouts_run_concurrently_and_each_rollouts_calls_in_order() -> None:
    seen: list[tuple[int, int]] = []

    def record(rollout: int, call: int) -> int:
        time.sleep(0.2)
        seen.append((rollout, call))
        return call

    calls = [[ToolCall("record", {"rollout": r, "call": c}) for c in range(2)] for r in range(4)]
    begin = time.perf_counter()
    results = run_tool_calls(calls, [{"record": record}] * 4, timeout=5.0)
    assert time.perf_counter() - begin < 1.2  # 8 calls of 0.2 s; in order per rollout: 0.4 s
    assert [[r.content for r in rollout] for rollout in results] == [["0", "1"]] * 4
    for r in range(4):
        assert [c for rr, c in seen if rr == r] == [0, 1]


# ---------------------------------------------------------------------------------- the loop
def _two_turns(prompt: str, j: int) -> str:
    """Sample 0 calls multiply then answers; sample 1 answers at once."""
    if j == 1 and turn(prompt) == 0:
        return "No tools."
    return call_text("multiply", '{"a": 3, "b": 4}') if turn(prompt) == 0 else "It is 12."


def test_a_two_turn_episode_masks_exactly_the_tool_reply(tokenizer: Any) -> None:
    loop, backend = _loop(tokenizer, _two_turns, logprob=-0.5)
    out = loop.run([user("3*4?")] * 2, [[multiply]] * 2, PARAMS, group_size=2)
    # one call for the group's shared first turn, one for the single rollout that continues
    assert backend.calls == [(1, 2), (1, 1)]
    ids, mask = out.generation.completion_ids[0], out.tool_mask[0]
    reply = tool_reply_ids(tokenizer, [{"role": "tool", "name": "multiply", "content": "12"}])
    first = tokenizer(call_text("multiply", '{"a": 3, "b": 4}'),
                      add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    second = tokenizer("It is 12.", add_special_tokens=False)["input_ids"] + \
        [tokenizer.eos_token_id]
    assert ids == first + reply + second
    assert mask == [1] * len(first) + [0] * len(reply) + [1] * len(second)
    assert out.generation.logprobs[0] == [-0.5] * len(first) + [0.0] * len(reply) + \
        [-0.5] * len(second)
    assert out.model_token_counts == [len(first) + len(second), len(out.tool_mask[1])]
    assert out.tool_mask[1] == [1] * len(out.generation.completion_ids[1])
    assert [m["role"] for m in out.completions[0]] == ["assistant", "tool", "assistant"]
    assert out.completions[0][0]["tool_calls"][0]["function"] == \
        {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    assert out.completions[0][1]["content"] == "12"
    assert out.completions[0][2] == {"role": "assistant", "content": "It is 12."}
    assert (out.tool_calls, out.tool_failures) == ([1, 0], [0, 0])
    assert out.generation.finished == [True, True]
    # the completion is the chat template's rendering of the conversation after the prompt
    prompt = loop.render(user("3*4?"), [multiply])
    assert out.generation.prompt_ids[0] == prompt
    conversation = tokenizer.apply_chat_template(user("3*4?") + out.completions[0],
                                                 tools=[multiply], tokenize=False)
    assert tokenizer.decode(prompt + ids) == conversation.rstrip("\n")


def test_failures_are_counted_and_the_model_reads_them(tokenizer: Any) -> None:
    arguments = ['{"a": 3, "b": 4}', '{"a": 3, "c": 4}', '{"step": 1}']
    names = ["multiply", "multiply", "decrement"]

    def script(prompt: str, j: int) -> str:
        if turn(prompt) == 0:
            return call_text(names[j], arguments[j])
        return "saw error" if "Error" in prompt else "saw 12"

    loop, backend = _loop(tokenizer, script)
    out = loop.run([user("go")] * 3, [[multiply]] * 3, PARAMS, group_size=3)
    assert backend.calls == [(1, 3), (3, 1)]
    assert out.tool_calls == [1, 1, 1]
    assert out.tool_failures == [0, 1, 1]
    assert [c[-1]["content"] for c in out.completions] == ["saw 12", "saw error", "saw error"]


@pytest.mark.parametrize("policy", ["end", "reply"])
def test_malformed_calls_end_the_rollout_or_are_answered(tokenizer: Any, policy: str) -> None:
    def script(prompt: str, j: int) -> str:
        return '<tool_call>\n{"arguments": {a: 3}}\n</tool_call>' if turn(prompt) == 0 else "ok"

    loop, backend = _loop(tokenizer, script, malformed=policy)
    out = loop.run([user("go")], [[multiply]], PARAMS, group_size=1)
    assert out.tool_calls == [1]
    assert out.tool_failures == [1]
    if policy == "end":
        assert backend.calls == [(1, 1)]
        assert [m["role"] for m in out.completions[0]] == ["assistant"]
    else:
        assert backend.calls == [(1, 1), (1, 1)]
        assert "not valid JSON" in out.completions[0][1]["content"]
        assert out.completions[0][-1]["content"] == "ok"


def test_a_reply_that_overflows_the_budget_is_rolled_back(tokenizer: Any) -> None:
    def verbose(n: int) -> str:
        """Talks.

        Args:
            n: how much
        """
        return "x" * n

    def script(prompt: str, j: int) -> str:
        return call_text("verbose", f'{{"n": {10 if j == 0 else 400}}}') if turn(prompt) == 0 \
            else "done"

    budget = 200
    loop, backend = _loop(tokenizer, script, max_completion_length=budget)
    out = loop.run([user("go")] * 2, [[verbose]] * 2, PARAMS, group_size=2)
    assert backend.calls == [(1, 2), (1, 1)]  # only the short reply was sent back
    kept, rolled = out.generation.completion_ids
    assert len(kept) <= budget
    assert out.completions[0][-1]["content"] == "done"
    assert [m["role"] for m in out.completions[1]] == ["assistant"]  # the reply was dropped
    assert out.tool_mask[1] == [1] * len(rolled)
    assert rolled[-1] == tokenizer.eos_token_id
    assert out.generation.finished == [True, True]
    assert out.tool_calls == [1, 1]  # the call ran (its effects cannot be undone)


def test_a_huge_reply_is_rolled_back_without_being_tokenized(tokenizer: Any,
                                                             monkeypatch: Any) -> None:
    """A tool that answers with megabytes (hostile, or a bug) costs no tokenizer pass over
    them: its text alone needs more tokens than the budget has room for."""
    def flood(n: int) -> str:
        """Floods.

        Args:
            n: how much
        """
        return "x" * n

    def script(prompt: str, j: int) -> str:
        return call_text("flood", '{"n": 5000000}') if turn(prompt) == 0 else "done"

    seen: list[int] = []
    encode = type(tokenizer).__call__

    def measured(self: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(text) if isinstance(text, str) else 0)
        return encode(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", measured)
    loop, backend = _loop(tokenizer, script, max_completion_length=200)
    out = loop.run([user("go")], [[flood]], PARAMS, group_size=1)
    assert backend.calls == [(1, 1)]  # the reply was not sent back
    assert [m["role"] for m in out.completions[0]] == ["assistant"]
    assert out.tool_calls == [1]
    assert max(seen) < 100_000  # the 5 MB reply never reached the tokenizer


def test_a_later_turn_is_cut_at_the_remaining_budget(tokenizer: Any) -> None:
    def script(prompt: str, j: int) -> str:
        return call_text("multiply", '{"a": 1, "b": 2}') if turn(prompt) == 0 else "y" * 500

    loop, _ = _loop(tokenizer, script, max_completion_length=150)
    out = loop.run([user("go")], [[multiply]], PARAMS, group_size=1)
    assert len(out.generation.completion_ids[0]) == 150
    assert out.generation.finished == [False]


def test_the_context_limit_also_rolls_a_reply_back(tokenizer: Any) -> None:
    def script(prompt: str, j: int) -> str:
        return call_text("multiply", '{"a": 1, "b": 2}') if turn(prompt) == 0 else "done"

    loop, _ = _loop(tokenizer, script)
    prompt = len(loop.render(user("go"), [multiply]))
    first = len(tokenizer(call_text("multiply", '{"a": 1, "b": 2}'),
                          add_special_tokens=False)["input_ids"]) + 1
    loop.max_context = prompt + first + 5  # no room for the reply
    out = loop.run([user("go")], [[multiply]], PARAMS, group_size=1)
    assert len(out.generation.completion_ids[0]) == first
    assert out.tool_calls == [1]


def test_max_iterations_bounds_the_rounds_of_tool_calls(tokenizer: Any) -> None:
    def script(prompt: str, j: int) -> str:
        return call_text("multiply", '{"a": 1, "b": 2}')  # calls forever

    loop, backend = _loop(tokenizer, script, max_iterations=2)
    out = loop.run([user("go")], [[multiply]], PARAMS, group_size=1)
    assert len(backend.calls) == 3
    assert out.tool_calls == [2]
    assert [m["role"] for m in out.completions[0]] == ["assistant", "tool"] * 2 + ["assistant"]


def test_rollouts_with_their_own_prompts_are_generated_row_by_row(tokenizer: Any) -> None:
    loop, backend = _loop(tokenizer, lambda prompt, j: "hello")
    out = loop.run([user("a"), user("b")], [[multiply]] * 2, PARAMS, group_size=2)
    assert backend.calls == [(2, 1)]
    assert out.tool_calls == [0, 0]


# ---------------------------------------------------------------------------------- environments
class Counter:
    def __init__(self) -> None:
        self.count = 0
        self.resets: list[dict[str, Any]] = []

    def reset(self, **row: Any) -> str:
        self.count = 0
        self.resets.append(row)
        return " Count up."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)

    def _hidden(self) -> None:
        """Not a tool."""


class Echo:
    def reset(self, **row: Any) -> None:
        return None

    def shout(self, text: str) -> str:
        """Shout.

        Args:
            text: Text to shout.
        """
        return text.upper()


def test_environments_pool_instances_and_expose_public_methods_as_tools() -> None:
    environments = Environments({"counter": Counter, "echo": Echo}, tools=[multiply])
    assert [t.__name__ for t in environments.tools["counter"]] == ["multiply", "increment"]
    assert [t.__name__ for t in environments.tools["echo"]] == ["multiply", "shout"]
    assert environments.reward_classes == [Counter]
    first = environments.instances(["counter", "counter", "echo"])
    assert len({id(e) for e in first}) == 3
    assert len(environments.pool["counter"]) == 2
    again = environments.instances(["counter", "echo"])
    assert again[0] is first[0]
    assert again[1] is first[2]
    with pytest.raises(ValueError, match="not among the environments"):
        environments.instances(["unknown"])
    reward = environments.reward_function(Counter)
    first[0].count = 3
    assert reward.__name__ == "Counter"
    assert reward(environments=[first[0], first[2]]) == [3.0, None]


def test_an_environment_without_reset_is_refused() -> None:
    class NoReset:
        def act(self) -> None:
            """Act."""

    with pytest.raises(ValueError, match="must define a callable `reset`"):
        Environments(NoReset)


def test_an_environments_tools_act_on_the_rollouts_own_instance(tokenizer: Any) -> None:
    from mtgrpo.rollout.agent import AgentRollouts
    from mtgrpo.tasks import PromptSet

    def script(prompt: str, j: int) -> str:
        if turn(prompt) == 0 and j == 0:
            return call_text("increment", '{"step": 2}')
        return "done"

    loop, _backend = _loop(tokenizer, script)
    environments = Environments(Counter)
    rollouts = AgentRollouts(loop, environments=environments, hidden_columns=("task",))
    prompts = PromptSet([{"prompt": user("Start."), "task": "default", "level": 1}], tokenizer)
    batch = rollouts.run(prompts, [0], PARAMS, group_size=2)
    assert [e.count for e in batch.environments] == [2, 0]
    assert batch.environments[0] is not batch.environments[1]
    assert batch.environments[0].resets == [{"prompt": user("Start."), "level": 1}]
    assert batch.prompts[0] == user("Start. Count up.")
    assert batch.output.tool_calls == [1, 0]


# ---------------------------------------------------------------------------------- the worker
def test_the_worker_scores_tool_rollouts_and_counts_calls_per_task(tokenizer: Any) -> None:
    from mtgrpo.rewards import RewardSuite
    from mtgrpo.rollout import RolloutWorker
    from mtgrpo.rollout.agent import AgentRollouts
    from mtgrpo.tasks import PromptSet

    def script(prompt: str, j: int) -> str:
        if turn(prompt) == 0 and j == 0:
            return call_text("increment", '{"step": 3}')
        return "done"

    seen: dict[str, Any] = {}

    def count_reward(completions: list[Any], environments: list[Any], **_: Any) -> list[float]:
        seen["completions"], seen["environments"] = completions, environments
        return [float(getattr(e, "count", 0)) for e in environments]

    loop, _ = _loop(tokenizer, script)
    environments = Environments({"counter": Counter, "echo": Echo})
    rows = [{"prompt": user("Go."), "task": "counter", "environment": "counter"},
            {"prompt": user("Go."), "task": "echo", "environment": "echo"}]
    prompts = PromptSet(rows, tokenizer)
    worker = RolloutWorker(prompts, loop.backend, RewardSuite.from_user(count_reward), PARAMS,
                           group_size=2, tokenizer=tokenizer,
                           agent=AgentRollouts(loop, environments=environments,
                                               hidden_columns=("task",)))
    counter, echo = worker([0, 1])
    assert counter.rewards[:, 0].tolist() == [3.0, 0.0]
    assert echo.rewards[:, 0].tolist() == [0.0, 0.0]  # echo has no increment: a failed call
    assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool", "assistant"]
    assert [type(e).__name__ for e in seen["environments"]] == ["Counter"] * 2 + ["Echo"] * 2
    mask = counter.payload.tool_mask
    assert 0 in mask[0]
    assert set(mask[1]) == {1}
    assert counter.payload.model_token_counts == [sum(m) for m in mask]
    assert counter.payload.row_prompt_ids[0] == counter.payload.prompt_ids
    assert worker.tool_metrics() == {
        "tools/call_frequency": 0.5, "tools/failure_frequency": 0.5,
        "tasks/counter/tool_call_frequency": 0.5, "tasks/counter/tool_failure_frequency": 0.0,
        "tasks/echo/tool_call_frequency": 0.5, "tasks/echo/tool_failure_frequency": 1.0,
    }
    worker.reset()
    assert worker.tool_metrics()["tools/call_frequency"] == 0.0
