"""docs/configuration.md: the native options (:func:`mtgrpo.config.reference_markdown`), then
TRL's fields that do not act here and TRL's other names (:mod:`mtgrpo.compat.trl_fields`)."""

from __future__ import annotations

from mtgrpo.compat.trl_fields import compatibility_rows
from mtgrpo.config import reference_markdown as native_reference

__all__ = ["reference_markdown"]


def reference_markdown() -> str:
    rows = compatibility_rows()
    lines = [native_reference().rstrip(), "",
             "#### TRL's `GRPOConfig` (`mtgrpo.compat.GRPOConfig`)", "",
             "`GRPOConfig` takes every option above by its flat name and counts as TRL 1.16 "
             "does: `steps_per_generation` in micro-batches, `max_steps` and the intervals in "
             "optimizer steps. It also takes the TRL 1.16 / transformers fields below, which a "
             "run file may hold too. *alias*: another name of an option above, which it sets; "
             "*no effect*: any value is accepted (a non-default value is named in a warning); "
             "*refused*: only the default is accepted, anything else is an error that names "
             "the alternative.",
             "", "| option | default | effect |", "|---|---|---|"]
    for name, default, effect, text in rows:
        label = {"refused": "refused", "alias": "alias"}.get(effect, "no effect")
        reason = text.removeprefix("no effect: ").removeprefix("no effect ")
        lines.append(f"| `{name}` | `{default}` | {label}: {reason} |")
    return "\n".join(lines).rstrip() + "\n"
