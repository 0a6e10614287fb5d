"""Warm-start examples for environments: an episode solved by its demonstration, rendered by
the chat template exactly as the tool loop renders a rollout (:mod:`mtgrpo.tasks.episodes`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtgrpo.rollout.agent.environments import environment_methods, with_observation
from mtgrpo.rollout.agent.execution import tools_by_name
from mtgrpo.tasks.episodes import EnvironmentSpec

__all__ = ["FINAL_TURN", "demonstration_example"]

FINAL_TURN = "Done."  # the demonstrations' last assistant turn, after the last tool reply



def demonstration_example(spec: EnvironmentSpec, row: Mapping[str, Any], tokenizer: Any,
                          chat_template_kwargs: Mapping[str, Any] | None = None
                          ) -> dict[str, Any]:
    """A warm-start example (``prompt`` and ``completion`` text, ``task``) from playing the
    episode ``row`` with ``spec``'s demonstration: the prompt as the tool loop renders it (the
    environment's observation appended, its tools listed) and the completion as the model's
    turns and the tool replies between them, ending with a short last turn. Raises
    ``ValueError`` when the environment has no demonstration or the demonstration does not
    earn the environment's full reward (a wrong demonstration would teach a wrong answer)."""
    if spec.demonstration is None:
        raise ValueError(f"environment {spec.name!r} has no demonstration, so the warm start "
                         "cannot teach it; add demonstration: pkg.module:function to its entry "
                         "or drop the sft section")
    environment = spec.factory()
    # the routing column is no reset argument (TRL drops it where it routes rows)
    reset = {k: v for k, v in row.items() if k != "environment"}
    messages = with_observation(row["prompt"], environment.reset(**reset))
    tools = environment_methods(environment)
    by_name = tools_by_name(tools)
    turns: list[dict[str, Any]] = []

    def call(name: str, **arguments: Any) -> str:
        reply = str(by_name[name](**arguments))
        turns.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": name, "arguments": arguments}}]})
        turns.append({"role": "tool", "name": name, "content": reply})
        return reply

    spec.demonstration(call, row)
    reward = environment.get_reward() if callable(getattr(environment, "get_reward", None)) \
        else None
    if not turns or (reward is not None and reward < 1.0):
        raise ValueError(f"the demonstration of {spec.name!r} episode {row.get('id')} earns "
                         f"reward {reward} with {len(turns) // 2} calls; it must solve the "
                         "episode")
    turns.append({"role": "assistant", "content": FINAL_TURN})
    kwargs = dict(chat_template_kwargs or {})
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                           add_generation_prompt=True, **kwargs)
    full = tokenizer.apply_chat_template(messages + turns, tools=tools, tokenize=False, **kwargs)
    if not full.startswith(prompt):
        raise ValueError("the chat template does not extend the prompt with the assistant's "
                         "turns (not prefix-preserving); tool calling needs one that does")
    completion = full[len(prompt):]
    eos = tokenizer.eos_token
    if eos and eos in completion:  # the last turn ends at EOS, as a sampled one does
        completion = completion[: completion.rindex(eos) + len(eos)]
    return {"prompt": prompt, "completion": completion, "task": spec.name}
