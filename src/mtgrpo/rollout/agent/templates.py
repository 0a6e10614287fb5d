"""A ChatML chat template that renders tools, tool calls and tool replies (Hermes format):
:data:`HERMES_CHATML_TEMPLATE`, defined with the tiny model's templates in
:mod:`mtgrpo.models.chat_templates`. For a tokenizer whose own template has no tool support, set
``tokenizer.chat_template = HERMES_CHATML_TEMPLATE``."""

from __future__ import annotations

from mtgrpo.models.chat_templates import HERMES_CHATML_TEMPLATE

__all__ = ["HERMES_CHATML_TEMPLATE"]
