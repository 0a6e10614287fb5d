"""TRL 1.16's flat ``GRPOConfig``, mapped onto the native :class:`~mtgrpo.config.TrainConfig`.

:class:`GRPOConfig` takes every field of TRL 1.16's ``GRPOConfig`` by its flat name: the
native options (the fields of :class:`~mtgrpo.config.TrainConfig`'s sections, with their
help text and defaults), TRL's other names for two of them, and the fields that do not act
here (:mod:`mtgrpo.compat.trl_fields`: no effect, with a warning when set, or refused with the
alternative). It counts as TRL 1.16 does:

* ``steps_per_generation`` counts micro-batches of ``per_device_train_batch_size``
  completions (default: ``gradient_accumulation_steps``): a generation batch holds
  ``per_device_train_batch_size × steps_per_generation × world size`` completions (TRL's
  ``generation_batch_size``) and is trained in ``steps_per_generation /
  gradient_accumulation_steps`` optimizer steps, ``num_iterations`` times over;
* ``max_steps``, ``logging_steps``, ``eval_steps`` and ``save_steps`` count optimizer steps
  (the native ``step_unit: optimizer``).

:meth:`GRPOConfig.to_native` builds the tree the trainer reads; it is built (and so checked)
when the config is, and again after a field changes. Anything else the native config offers
(``resolved_prompts_per_step()``, ``training_steps()``, the sections) is read through it.

Run files are flat too: :func:`load_run_config` reads one as :mod:`mtgrpo.config` does, and
also takes these TRL fields and ``step_counts: trl`` (the whole training part read as this
class).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtgrpo._config_types import checked_keywords, coerce_numbers, refuse_unknown
from mtgrpo.algo.registry import resolve_aggregation
from mtgrpo.compat.trl_fields import TRLCompatibleFields, check_compatibility_fields
from mtgrpo.config import FIELD_SECTION, SECTIONS, RunConfig, TrainConfig
from mtgrpo.config import load_run_config as _load_native

__all__ = ["STEP_COUNTS", "GRPOConfig", "load_run_config", "training_from_flat"]

logger = logging.getLogger("mtgrpo.config")

_NATIVE_ONLY = ("step_unit",)  # fixed by the class: TRL counts optimizer steps
_OWN = [name for name in FIELD_SECTION if name not in _NATIVE_ONLY]
_DEFAULT_AGGREGATION = "sum_then_normalize"


_WRITES = ("set",)  # the native tree's setters: GRPOConfig is written by its flat fields


class _ReadOnlySection:
    """A section of :meth:`GRPOConfig.to_native`'s tree, read through ``GRPOConfig``: writing
    it would change a tree the next change of a flat field rebuilds, so it is refused."""

    def __init__(self, section: Any) -> None:
        # past __setattr__ below, which refuses every write
        object.__setattr__(self, "_section", section)

    def __getattr__(self, name: str) -> Any:
        # not self._section: that would call __getattr__ again while _section is unset
        return getattr(object.__getattribute__(self, "_section"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"GRPOConfig's sections are read-only views; set the flat field instead "
            f"(args.{name} = {value!r})")

    def __repr__(self) -> str:
        return repr(object.__getattribute__(self, "_section"))


class _TRLConfig(TRLCompatibleFields):
    """What :class:`GRPOConfig` adds to its fields (the module docstring says what)."""

    def __post_init__(self) -> None:
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps  # TRL's default
        self._apply_aliases()
        check_compatibility_fields(self)
        self._native: tuple[dict[str, Any], TrainConfig] | None = None
        native = self.to_native()
        for name in _OWN:  # the values as the native checks normalised them
            if name != "steps_per_generation":  # kept in TRL's unit, micro-batches
                setattr(self, name, native.get(name))
        self._native = (self._snapshot(), native)
        self._convert_accelerator_config()

    def _apply_aliases(self) -> None:
        values = {"multi_objective_aggregation": self.multi_objective_aggregation}
        _apply_aliases(values, self)
        for name, value in values.items():
            setattr(self, name, value)
        self.reward_aggregation_method = self.vllm_importance_sampling_cap = None

    # ------------------------------------------------------------------ the native tree
    def _snapshot(self) -> dict[str, Any]:
        # a copy: a list field changed in place must differ from the snapshot
        return copy.deepcopy({name: getattr(self, name) for name in _OWN})

    def to_native(self) -> TrainConfig:
        """The :class:`~mtgrpo.config.TrainConfig` these fields mean (built again only after
        a field changed)."""
        snapshot = self._snapshot()
        if self._native is not None and self._native[0] == snapshot:
            return self._native[1]
        steps, accumulation = self.steps_per_generation, self.gradient_accumulation_steps
        whole = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                    for v in (steps, accumulation))
        if whole and steps % accumulation:
            below = max(accumulation, steps - steps % accumulation)
            raise ValueError(
                f"steps_per_generation={steps} is not a multiple of gradient_accumulation_steps="
                f"{accumulation}: an optimizer step would take micro-batches from two generation "
                f"batches, which mtgrpo does not do; set steps_per_generation={below} or "
                f"{below + accumulation} (or gradient_accumulation_steps to a divisor of {steps})"
            )
        # TRL counts micro-batches, the native tree optimizer steps (a bad value is left for
        # the native checks to name)
        values = {**snapshot, "step_unit": "optimizer",
                  "steps_per_generation": steps // accumulation if whole else steps}
        native = TrainConfig.from_flat(values)
        self._native = (snapshot, native)
        return native

    def __getattr__(self, name: str) -> Any:
        # Only for names that are not fields: the native tree's sections, methods and
        # properties (``config.loss``, ``training_steps()``), read through it. The flat fields
        # are what this object holds, so a section reads as a view that cannot be written.
        if name.startswith("_") or name in _WRITES or (
                not hasattr(TrainConfig, name) and name not in SECTIONS):
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}")
        value = getattr(self.to_native(), name)
        return _ReadOnlySection(value) if name in SECTIONS else value

    # ------------------------------------------------------------------ TRL's surface
    def updates_per_generation(self) -> int:
        return self.steps_per_generation // self.gradient_accumulation_steps

    def _convert_accelerator_config(self) -> None:
        """A mapping or a JSON file becomes transformers' ``AcceleratorConfig`` (which imports
        torch); the default ``None`` stays None until read (:meth:`accelerator_settings`), so
        building a default config imports no torch."""
        value = self.accelerator_config
        if value is None or not isinstance(value, Mapping | str):
            return
        from transformers.trainer_pt_utils import AcceleratorConfig

        if isinstance(value, Mapping):
            self.accelerator_config = AcceleratorConfig(**value)
        else:
            self.accelerator_config = AcceleratorConfig.from_json_file(value)

    def accelerator_settings(self) -> Any:
        """``accelerator_config`` as transformers' ``AcceleratorConfig`` (its default for
        None); kept in the field from then on."""
        if self.accelerator_config is None:
            from transformers.trainer_pt_utils import AcceleratorConfig

            self.accelerator_config = AcceleratorConfig()
        return self.accelerator_config

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        if self.accelerator_config is not None:
            from transformers.trainer_pt_utils import AcceleratorConfig

            out["accelerator_config"] = None if self.accelerator_config == AcceleratorConfig() \
                else dataclasses.asdict(self.accelerator_config)
        return out

    # transformers' callbacks read the arguments through these (from this class's to_dict)
    to_sanitized_dict = TrainConfig.to_sanitized_dict
    to_json_string = TrainConfig.to_json_string

    def __getstate__(self) -> dict[str, Any]:
        # a pickle holds the fields only: the tree is rebuilt from them when first read
        return {k: v for k, v in self.__dict__.items() if k != "_native"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _native=None)


def _native_fields() -> list[tuple[str, Any, Any]]:
    """The native options as flat dataclass fields: the same types, defaults and help."""
    fields = []
    for kind in SECTIONS.values():
        hints = typing.get_type_hints(kind)
        for f in dataclasses.fields(kind):
            if f.name in _NATIVE_ONLY:
                continue
            default = {"default": f.default} if f.default is not dataclasses.MISSING \
                else {"default_factory": f.default_factory}
            fields.append((f.name, hints[f.name],
                           dataclasses.field(metadata=f.metadata, **default)))
    return fields


GRPOConfig = checked_keywords(
    dataclasses.make_dataclass("GRPOConfig", _native_fields(), bases=(_TRLConfig,)),
    fix="correct the name (GRPOConfig takes TRL 1.16's GRPOConfig options and mtgrpo's, listed "
        "in docs/configuration.md)")
GRPOConfig.__module__ = __name__  # for pickle and for the reference
GRPOConfig.__doc__ = """TRL 1.16's ``GRPOConfig``: every TRL field by its flat name, counted as
TRL counts (``steps_per_generation`` in micro-batches; ``max_steps`` and the intervals in
optimizer steps). The trainer reads :meth:`to_native`'s tree; see :mod:`mtgrpo.compat.config`.
"""


# ------------------------------------------------------------------------------- run files
STEP_COUNTS = ("training", "trl")
"""A run file's optional top-level ``step_counts``: ``trl`` reads its training options as
:class:`GRPOConfig` (TRL's units and fields)."""

_TRL_ONLY = {f.name for f in dataclasses.fields(TRLCompatibleFields)}


def training_from_flat(values: Mapping[str, Any]) -> TrainConfig:
    """A run file's training options: native names (flat or as sections), TRL's fields that
    do not act (warned about, or refused, as :class:`GRPOConfig` does) and its aliases, and
    ``step_counts``."""
    values = dict(values)
    counts = values.pop("step_counts", "training")
    if counts not in STEP_COUNTS:
        raise ValueError(
            f"step_counts={counts!r} must be one of {', '.join(STEP_COUNTS)}: training counts "
            "max_steps and the intervals in training steps (one generation batch each), trl "
            "as TRL 1.16's GRPOConfig (optimizer steps, steps_per_generation in micro-batches)")
    if counts == "trl":
        flat = {k: v for k, v in values.items() if k not in SECTIONS}
        for section in (k for k in values if k in SECTIONS):
            flat.update(values[section])
        names = [f.name for f in dataclasses.fields(GRPOConfig)]
        refuse_unknown([k for k in flat if k not in names], names, "config")
        return GRPOConfig(**coerce_numbers(GRPOConfig, flat)).to_native()
    trl = {k: values.pop(k) for k in list(values) if k in _TRL_ONLY}
    if trl:
        fields = TRLCompatibleFields(**coerce_numbers(TRLCompatibleFields, trl))
        check_compatibility_fields(fields)
        _apply_aliases(values, fields)
    return TrainConfig.from_flat(values)


def _apply_aliases(values: dict[str, Any], trl: TRLCompatibleFields) -> None:
    """TRL's other names for two native options, written into ``values`` (flat names): the
    tutorials' ``reward_aggregation_method`` (given alone it replaces the default; beside a
    different ``multi_objective_aggregation`` it is an error) and the deprecated
    ``vllm_importance_sampling_cap``."""
    if trl.vllm_importance_sampling_cap is not None:
        logger.warning("vllm_importance_sampling_cap is deprecated (as in TRL); it sets "
                       "vllm_importance_sampling_clip_max=%s", trl.vllm_importance_sampling_cap)
        values["vllm_importance_sampling_clip_max"] = trl.vllm_importance_sampling_cap
    if trl.reward_aggregation_method is not None:
        given = values.get("multi_objective_aggregation", _DEFAULT_AGGREGATION)
        values["multi_objective_aggregation"] = resolve_aggregation(
            multi_objective_aggregation=None if given == _DEFAULT_AGGREGATION else given,
            reward_aggregation_method=trl.reward_aggregation_method)


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """:func:`mtgrpo.config.load_run_config`, also taking TRL's fields and ``step_counts``
    (what ``mtgrpo train CONFIG.yaml`` reads)."""
    return _load_native(path, overrides, training=training_from_flat)
