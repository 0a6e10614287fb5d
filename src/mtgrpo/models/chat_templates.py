"""Chat templates: the tiny model's ChatML ones and a ChatML template with tool calls.

``HERMES_CHATML_TEMPLATE`` renders tools, tool calls and tool replies (Hermes format), for a
tokenizer whose own template cannot render a tool-calling conversation (the tiny model's plain
ChatML one, a base model's): the tools' JSON schemas go into a system turn, an assistant turn's
calls are written as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (what
:func:`~mtgrpo.rollout.agent.parsing.parse_hermes_tool_calls` reads) and each tool reply is a
user turn wrapped in ``<tool_response>``, as Qwen2.5's template does. The template is
prefix-preserving: a conversation renders as the rendering of its first turns followed by the
rest, which the tool loop relies on.
"""

from __future__ import annotations

__all__ = ["HERMES_CHATML_TEMPLATE", "TOOLS_CHATML_TEMPLATE"]

HERMES_CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n# Tools\\n\\nYou may call one or more functions to assist with "
    "the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML "
    "tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- if (message['content'] or '') or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' + "
    "(call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    # a tool reply renders as a user turn, as Qwen2.5's template does
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# the turns part is shared: only the tools header differs between the two
_TURNS = HERMES_CHATML_TEMPLATE.index("{%- for message in messages %}")

TOOLS_CHATML_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nTools:' }}{%- for tool in tools %}"
    "{{- (',' if not loop.first else '') + ' ' + tool['function']['name'] + '(' + "
    "((tool['function']['parameters'] or {}).get('properties') or {}) | list | join(', ') "
    "+ ')' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
    + HERMES_CHATML_TEMPLATE[_TURNS:]
)
"""The Hermes template with the tools listed compactly (``Tools: calculate(expression),
submit(answer)``) instead of as JSON schemas: a full schema is ~300 characters per tool, more
than a small model's context can spare. Without tools it renders exactly as ChatML."""
