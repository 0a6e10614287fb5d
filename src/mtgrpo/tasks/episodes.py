"""Environments as tasks in a run file: episodes to train and evaluate on, and demonstrations
for the warm start.

A run file's ``environments`` section (:class:`EnvironmentsConfig`) names each environment the
policy trains in; each environment is a task (per-environment metrics, task weights over
environments, the ratio-preserving sampler)::

    environments:
      environments:
        calculator: {kind: calculator, digits: [3, 2]}
        guess: {kind: guess_the_number, width: 20, max_guesses: 6}
      train_size: 400          # episodes per environment
      eval_size: 100           # held-out episodes per environment, none of them trained on

An entry is a built-in kind (:data:`ENVIRONMENT_KINDS`; its other keys are the options of its
episodes) or the user's own environment::

    shop: {factory: my_pkg.envs:ShopEnv, episodes: my_pkg.envs:shop_episode,
           demonstration: my_pkg.envs:shop_demonstration, catalog_size: 50}

* ``factory``: TRL's ``environment_factory`` contract (``reset(**row)``, public methods as tools,
  optional ``get_reward()``, :mod:`mtgrpo.rollout.agent.environments`);
* ``episodes(rng, **options) -> dict``: one episode's row (``prompt`` as chat messages and the
  columns ``reset`` reads), drawn from ``rng`` (a :class:`random.Random`); episodes are told
  apart by their content (the row without ``prompt``), so the evaluation split holds none of
  the training or warm-start episodes;
* ``demonstration(call, row)`` (optional, needed by a warm start): solves the episode by calling
  ``call(tool_name, **arguments) -> reply`` (the environment's own tools answer); the calls and
  replies become the warm start's example, rendered by the model's chat template exactly as the
  tool loop renders a rollout (:func:`mtgrpo.rollout.agent.demonstrations.demonstration_example`).
"""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mtgrpo._config_types import option
from mtgrpo.algo.registry import Registry, import_object

__all__ = [
    "ENVIRONMENT_KINDS",
    "EnvironmentKind",
    "EnvironmentSpec",
    "EnvironmentsConfig",
    "ToolCaller",
    "calculator_episode",
    "guess_episode",
]

ToolCaller = Callable[..., str]

# Seed streams of the splits: the evaluation and warm-start episodes are drawn from other
# generators than the training ones (and then also left out of them by content).
_EVAL_STREAM = 1_000_003
_WARM_STREAM = 2_000_003
# Draws allowed per wanted episode before a split is declared too large for its space.
_DRAWS_PER_EPISODE = 50


@dataclass(frozen=True)
class EnvironmentKind:
    """A built-in environment: its class (an import path: the classes' module imports the
    reward and sandbox code, which a configuration does not need), how an episode is drawn,
    how it is solved."""

    factory: str
    episode: Callable[..., dict[str, Any]]
    demonstration: Callable[[ToolCaller, Mapping[str, Any]], None] | None
    description: str


def calculator_episode(rng: random.Random, digits: Sequence[int] = (3, 2),
                       operator: str = "*") -> dict[str, Any]:
    """``a <operator> b`` with ``digits[0]``- and ``digits[1]``-digit operands: a product the
    model cannot do in its head, so it must call ``calculate`` and ``submit`` the result."""
    if operator not in ("+", "-", "*"):
        raise ValueError(f"calculator operator {operator!r}: use '+', '-' or '*'")
    if (not isinstance(digits, Sequence) or len(digits) != 2
            or not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 6
                       for d in digits)):
        raise ValueError(f"calculator digits {digits!r}: give two operand sizes from 1 to 6, "
                         "e.g. [3, 2]")
    # Exactly d digits; a 1-digit operand may be 0.
    a, b = (rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1) for d in digits)
    expression = f"{a} {operator} {b}"
    answer = {"+": a + b, "-": a - b, "*": a * b}[operator]
    return {"prompt": [{"role": "user", "content": f"What is {expression}?"}],
            "expression": expression, "answer": str(answer)}


def _calculator_demonstration(call: ToolCaller, row: Mapping[str, Any]) -> None:
    call("submit", answer=call("calculate", expression=row["expression"]))


def guess_episode(rng: random.Random, low: int = 1, high: int = 100, width: int = 20,
                  max_guesses: int = 6, show_range: bool = False) -> dict[str, Any]:
    """A secret in a range of ``width`` integers placed at random within ``low..high``; the
    model has ``max_guesses`` guesses (binary search needs ``ceil(log2(width + 1))``);
    ``show_range``: each answer states the range left (:class:`GuessTheNumberEnv`)."""
    for name, value in (("low", low), ("high", high), ("width", width),
                        ("max_guesses", max_guesses)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"guess_the_number {name}={value!r} must be an integer")
    if width < 2 or high - low + 1 < width or max_guesses < 1:
        raise ValueError(f"guess_the_number: need width >= 2 within low..high ({low}..{high}) "
                         f"and max_guesses >= 1, got width={width}, max_guesses={max_guesses}")
    if not isinstance(show_range, bool):
        raise ValueError(f"guess_the_number show_range={show_range!r} must be true or false")
    start = rng.randint(low, high - width + 1)
    row = {"prompt": [{"role": "user", "content": "Find my secret number."}],
           "low": start, "high": start + width - 1,
           "secret": rng.randint(start, start + width - 1), "max_guesses": max_guesses}
    return {**row, "show_range": True} if show_range else row


def _guess_demonstration(call: ToolCaller, row: Mapping[str, Any]) -> None:
    """Binary search, reading the replies as the model must."""
    low, high = int(row["low"]), int(row["high"])
    while low <= high:
        guess = (low + high) // 2
        reply = call("guess", number=guess)
        if reply.startswith("correct"):
            return
        if reply.startswith("higher"):
            low = guess + 1
        elif reply.startswith("lower"):
            high = guess - 1
        else:
            return  # out of guesses: the demonstration fails, and is refused


ENVIRONMENT_KINDS: Registry[EnvironmentKind] = Registry("environment kind")
ENVIRONMENT_KINDS.add("calculator", EnvironmentKind(
    "mtgrpo.tasks.environments:CalculatorEnv", calculator_episode, _calculator_demonstration,
    "multiply (or add) large numbers with a calculate tool, then submit the result"))
ENVIRONMENT_KINDS.add("guess_the_number", EnvironmentKind(
    "mtgrpo.tasks.environments:GuessTheNumberEnv", guess_episode, _guess_demonstration,
    "find a secret integer in a range from higher/lower replies, within a budget of guesses"),
    aliases=("guess",))


@dataclass(frozen=True)
class EnvironmentSpec:
    """One environment of a run: its name (the task), how it is built, its episodes' options."""

    name: str
    factory_ref: Callable[[], Any] | str  # the factory, or a built-in's import path
    episode: Callable[..., dict[str, Any]]
    demonstration: Callable[[ToolCaller, Mapping[str, Any]], None] | None
    options: dict[str, Any]
    source: dict[str, Any]  # the run file's entry, as given

    @property
    def factory(self) -> Callable[[], Any]:
        """TRL's ``environment_factory`` of this environment (imported on first use)."""
        ref = self.factory_ref
        return import_object(ref) if isinstance(ref, str) else ref

    def draw(self, rng: random.Random) -> dict[str, Any]:
        row = self.episode(rng, **self.options)
        if not isinstance(row, Mapping) or not isinstance(row.get("prompt"), list):
            raise ValueError(f"environment {self.name!r}: its episodes function must return a "
                             f"dict with a 'prompt' list of chat messages, got {row!r:.120}")
        return dict(row)


def _content_key(row: Mapping[str, Any]) -> str:
    # The episode's content: its prompt is wording, not the problem (module docstring)
    return json.dumps({k: v for k, v in row.items() if k != "prompt"}, sort_keys=True,
                      default=str)


def _resolve(name: Any, entry: Any) -> EnvironmentSpec:
    # The name starts every row id, "<name>/<split>/<n>".
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ValueError(f"environment name {name!r}: use a non-empty name without '/', e.g. "
                         "calculator")
    if not isinstance(entry, Mapping):
        raise ValueError(f"environments.{name} must be a mapping such as {{kind: calculator}} "
                         f"or {{factory: pkg.module:Class, episodes: pkg.module:function}}, got "
                         f"{entry!r:.80}")
    options = dict(entry)
    kind_name = options.pop("kind", None)
    paths = {key: options.pop(key, None) for key in ("factory", "episodes", "demonstration")}
    if (kind_name is None) == (paths["factory"] is None):
        raise ValueError(f"environments.{name}: give either kind (one of "
                         f"{', '.join(ENVIRONMENT_KINDS.names())}) or factory and episodes "
                         "(import paths 'pkg.module:name')")
    if kind_name is not None:
        if paths["episodes"] is not None or paths["demonstration"] is not None:
            raise ValueError(f"environments.{name}: a built-in kind brings its own episodes "
                             "and demonstration; drop episodes/demonstration or use factory")
        kind = ENVIRONMENT_KINDS.get(str(kind_name))
        factory: Callable[[], Any] | str = kind.factory
        episode, demonstration = kind.episode, kind.demonstration
    else:
        if paths["episodes"] is None:
            raise ValueError(f"environments.{name}: factory needs episodes, an import path of "
                             "a function (rng, **options) -> row")
        factory, episode = import_object(paths["factory"]), import_object(paths["episodes"])
        demonstration = None if paths["demonstration"] is None \
            else import_object(paths["demonstration"])
        for what, value in (("factory", factory), ("episodes", episode),
                            ("demonstration", demonstration)):
            if value is not None and not callable(value):
                raise ValueError(f"environments.{name}.{what}: {value!r:.80} is not callable")
    parameters = inspect.signature(episode).parameters
    accepted = [p for p in list(parameters)[1:]  # the first parameter is the rng
                if parameters[p].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                          inspect.Parameter.KEYWORD_ONLY)]
    unknown = [key for key in options if key not in accepted]
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD
                           for p in parameters.values()):
        raise ValueError(f"environments.{name}: unknown option(s) {unknown}; its episodes take "
                         f"{', '.join(accepted) or 'no options'}")
    spec = EnvironmentSpec(name, factory, episode, demonstration, options, dict(entry))
    spec.draw(random.Random(0))  # the options' values are checked here, before any model loads
    return spec


@dataclass
class EnvironmentsConfig:
    """The ``environments`` section of a run file (module docstring)."""

    environments: dict[str, Any] = option(
        "Each environment (a task) by name: {kind: calculator | guess_the_number, <its "
        "episodes' options>} or {factory: pkg.module:Class, episodes: pkg.module:function, "
        "demonstration: pkg.module:function (for a warm start), <options>}.",
        default_factory=dict)
    train_size: int = option("Training episodes per environment.", default=500)
    eval_size: int = option("Held-out episodes per environment (none of them trained on).",
                            default=100)
    seed: int = option("Seed of the episodes (the splits are drawn from different streams).",
                       default=0)
    specs: dict[str, EnvironmentSpec] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.environments, Mapping) or not self.environments:
            raise ValueError("environments.environments must map each environment's name to "
                             "its entry, e.g. {calculator: {kind: calculator}}")
        for name in ("train_size", "eval_size", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    value < (0 if name == "seed" else 1):
                raise ValueError(f"environments.{name}={value!r} must be a "
                                 f"{'non-negative' if name == 'seed' else 'positive'} integer")
        self.specs = {str(name): _resolve(name, entry)
                      for name, entry in self.environments.items()}

    @classmethod
    def from_dict(cls, value: Any) -> EnvironmentsConfig:
        if not isinstance(value, Mapping):
            raise ValueError(f"the environments section must be a mapping, got {value!r:.80}")
        known = ("environments", "train_size", "eval_size", "seed")
        unknown = [key for key in value if key not in known]
        if unknown:
            raise ValueError(f"environments: unknown option(s) {unknown}; options: "
                             f"{', '.join(known)} (each environment goes under environments."
                             "environments)")
        return cls(**dict(value))

    def to_dict(self) -> dict[str, Any]:
        return {"environments": {name: dict(entry) for name, entry in self.environments.items()},
                "train_size": self.train_size, "eval_size": self.eval_size, "seed": self.seed}

    def factories(self) -> dict[str, Callable[[], Any]]:
        """TRL's ``environment_factory`` of the run: ``{name: factory}``."""
        return {name: spec.factory for name, spec in self.specs.items()}

    # ------------------------------------------------------------------ splits
    def eval_rows(self) -> list[dict[str, Any]]:
        """``eval_size`` held-out episodes per environment."""
        return self._rows("eval", self.eval_size, self.seed + _EVAL_STREAM, {})

    def train_rows(self) -> list[dict[str, Any]]:
        """``train_size`` training episodes per environment, none of them an evaluation one."""
        return self._rows("train", self.train_size, self.seed, self._keys(self.eval_rows()))

    def warm_start_rows(self, per_environment: int, offset: int = 0) -> list[dict[str, Any]]:
        """Episodes for the warm start: none of them a training or evaluation one."""
        seen = self._keys(self.eval_rows() + self.train_rows())
        return self._rows("warm", per_environment, self.seed + _WARM_STREAM + offset, seen)

    @staticmethod
    def _keys(rows: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
        keys: dict[str, set[str]] = {}
        for row in rows:
            # The keys _rows adds: a stored row's key equals its drawn one.
            content = {k: v for k, v in row.items() if k not in ("id", "environment")}
            keys.setdefault(row["environment"], set()).add(_content_key(content))
        return keys

    def _rows(self, split: str, size: int, seed: int,
              exclude: Mapping[str, set[str]]) -> list[dict[str, Any]]:
        rows = []
        for number, (name, spec) in enumerate(self.specs.items()):
            # A str seed is hashed (SHA-512): the same stream whatever PYTHONHASHSEED.
            rng = random.Random(f"{seed}/{number}/{name}")
            taken = set(exclude.get(name, ()))  # a copy: the caller's key sets stay as given
            found = 0
            # Bounded: a too-small episode space fails here instead of looping.
            for _ in range(size * _DRAWS_PER_EPISODE):
                row = spec.draw(rng)
                key = _content_key(row)
                if key in taken:
                    continue
                taken.add(key)
                rows.append({**row, "id": f"{name}/{split}/{found}", "environment": name})
                found += 1
                if found == size:
                    break
            else:
                raise ValueError(
                    f"environment {name!r}: only {found} distinct {split} episodes outside the "
                    f"other splits in {size * _DRAWS_PER_EPISODE} draws; widen its options or "
                    "lower environments.train_size / eval_size (or sft.num_examples)")
        return rows
