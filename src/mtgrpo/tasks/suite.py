"""Task suites: deterministic, cached, lazily generated train / eval splits of tasks.

A :class:`TaskSuite` holds tasks (:class:`~mtgrpo.tasks.families.TaskSpec`), prompt
options and a reward scheme, and exposes two splits, ``suite.train`` and ``suite.eval``
(:class:`SuiteSplit`), and a third when ``validation_size`` > 0, ``suite.validation``: the
tasks' items concatenated task by task, so the task of every prompt id is known before any item
exists (``split.prompt_tasks``, for the samplers).

Laziness. ``len(split)`` is known up front; ``split.get(i)`` returns row ``i`` and blocks
only until that item exists: from memory, from the disk cache, or generated on demand at
a priority that overtakes background work. ``split.start()`` generates everything else
in a background thread (through a :class:`~mtgrpo.tasks.generation.GenerationPool`,
interleaving tasks chunk by chunk so that no task waits for a slow one), writing each
completed chunk to the cache (:mod:`mtgrpo.tasks.cache`). Training can start at once.

Determinism and disjoint splits. reasoning-gym draws item ``i`` of a dataset with seed
``s`` from ``Random(s + i)``, so seed 7's item 1 is seed 8's item 0. Split ``k`` of a
suite with base seed ``s`` therefore uses the reasoning-gym seed
``s + k * SPLIT_SEED_STRIDE`` (train k = 0, eval k = 1, validation k = 2, stride 10⁹), and a
split of
``n`` items may use source indices ``[0, (max_retries + 1) · n)``, which must stay below
the stride (checked). The splits' source ranges are disjoint for every base seed, and for
base seeds ``s`` and ``s + 1`` as well. Families with a ``content_key`` (countdown,
generic reasoning-gym datasets) are also de-duplicated by content: a training item
whose problem occurs in the evaluation split of the same task, or in rows passed as
``exclude`` (e.g. the papers' test sets), is replaced. Building the training split of
such a task therefore generates its evaluation split first (countdown: well under a
second for 200 items). An evaluation item whose problem occurs in rows passed as
``exclude_eval`` (the problems a model trained on, when its checkpoint is measured on a
larger or reseeded held-out split than its run's) is replaced likewise.

The validation split (``validation_size`` items per task, none by default) is held out like
the evaluation split and drawn like it, from the whole distribution, so that its accuracy
estimates held-out accuracy without reading the evaluation split (task weights driven by it):
its items leave out the evaluation split's problems, and the training split leaves out its
problems as well as the evaluation split's. With ``validation_size=0`` the training split is
what it was without the option, item for item.

Replacement rule (deterministic). Position ``p`` of a split of size ``n`` is filled
from source index ``p``; if that item is rejected (generation raised, exceeded
``item_timeout_s``, or duplicates an excluded problem) it is filled from ``p + n``, then
``p + 2n``, …, up to ``max_retries`` replacements, after which the position fails with
:class:`GenerationError`. Exceptions and duplicates are deterministic; a time-out is
deterministic for a generator that truly loops (the reason the limit exists) and the
generous default limit (120 s against well under 2 s per item for every built-in level)
keeps slow-machine noise out. Each rejection is recorded in ``stats.skipped`` and the
source index of every item is in its metadata. Since positions move to other source
indices only on rejection, a cached split is reproducible across runs and machines.

Row schema (every row of every family, and of the papers' test sets, has these keys):

========== ===================================================================
``id``      unique, stable: ``"<task>/<split>/s<seed>/<position>"``
``task``    the task id, e.g. ``"countdown:medium"``
``prompt``  a string (``plain``) or a list of chat messages (``chat``, ``paper``)
``answer``  the gold answer as a string (countdown: one solution expression)
``metadata`` a JSON string: ``family``, ``level``, ``answer_format``, ``seed``,
            ``source_index`` and what the verifier needs (countdown: ``numbers`` and
            ``target``; ARC: ``arc_task``, ``size``; zebra: ``num_people``, …)
``split``   ``"train"``, ``"eval"``, ``"validation"`` or ``"test"`` (papers' test sets)
========== ===================================================================
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtgrpo.algo.registry import Registry
from mtgrpo.tasks.cache import CHUNK_SIZE, CacheKey, ItemCache
from mtgrpo.tasks.families import TaskFamily, TaskSpec, resolve_task
from mtgrpo.tasks.generation import (
    DEFAULT_ITEM_TIMEOUT_S,
    GenerationPool,
    ItemFailedError,
    ItemTimeoutError,
    PoolClosedError,
)
from mtgrpo.tasks.prompts import ANSWER_FORMATS, PROMPT_FORMATS, Prompt, format_prompt
from mtgrpo.tasks.rewards import RewardScheme, TaskReward, reward_routing

__all__ = [
    "SPLITS",
    "SPLIT_SEED_STRIDE",
    "SUITES",
    "GenerationError",
    "GenerationRate",
    "GenerationStats",
    "RenderOptions",
    "SkippedItem",
    "SuiteSplit",
    "TaskData",
    "TaskSuite",
    "make_suite",
    "measure_generation",
    "problem_keys",
    "split_seed",
]

SPLIT_SEED_STRIDE = 10**9  # reasoning-gym's item i of seed s is Random(s + i)
# The k of seed + k * SPLIT_SEED_STRIDE; renumbering reseeds every split.
SPLITS = {"train": 0, "eval": 1, "validation": 2}


def split_seed(seed: int, split: str) -> int:
    """The reasoning-gym seed of ``split`` for base ``seed`` (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SPLIT_SEED_STRIDE:
        raise ValueError(
            f"seed must be an integer in [0, {SPLIT_SEED_STRIDE}) (Python's Random treats a "
            f"negative seed as its absolute value, which would alias splits); got {seed!r}"
        )
    return seed + SPLITS[split] * SPLIT_SEED_STRIDE


class GenerationError(RuntimeError):
    """A position could not be filled: every allowed source index was rejected."""


@dataclass(frozen=True)
class SkippedItem:
    """A rejected source index: which position it was for and why."""

    position: int
    source_index: int
    reason: str


@dataclass
class GenerationStats:
    """Counters of one task split: items generated here, items read from the cache."""

    generated: int = 0
    loaded: int = 0
    skipped: list[SkippedItem] = field(default_factory=list)


@dataclass(frozen=True)
class RenderOptions:
    """How stored items become rows: prompt format, answer format, ``<think>`` prefix."""

    prompt_format: str = "plain"
    answer_format: str = "answer_tag"
    think_prefix: bool = False
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_format", PROMPT_FORMATS.canonical(self.prompt_format))
        object.__setattr__(self, "answer_format", ANSWER_FORMATS.canonical(self.answer_format))
        if not isinstance(self.think_prefix, bool):
            raise TypeError(f"think_prefix must be True or False, got {self.think_prefix!r}")
        if self.system_prompt is not None and self.prompt_format == "plain":
            raise ValueError(
                "system_prompt needs a message format; use prompt_format='chat' or 'paper' "
                "(the plain template's preamble is fixed)"
            )

    def prompt(self, family: TaskFamily, item: Mapping[str, Any]) -> Prompt:
        """The prompt of one item: its family's question for the answer format, wrapped in
        the prompt format."""
        question = family.question(item, ANSWER_FORMATS.get(self.answer_format))
        return format_prompt(
            question,
            self.prompt_format,
            think_prefix=self.think_prefix,
            system_prompt=self.system_prompt,
        )

    def row(self, spec: TaskSpec, split: str, seed: int, item: Mapping[str, Any]) -> dict[str, Any]:
        """The row (see the module docstring) for one stored item."""
        prompt = self.prompt(spec.family, item)
        metadata = {
            **item["metadata"],
            "family": spec.family.name,
            "level": spec.level,
            "answer_format": self.answer_format,
            "seed": seed,
            "source_index": item["source_index"],
        }
        return {
            "id": f"{spec.task_id}/{split}/s{seed}/{item['position']}",
            "task": spec.task_id,
            "prompt": prompt,
            "answer": item["answer"],
            "metadata": json.dumps(metadata, sort_keys=True),  # one text per metadata
            "split": split,
        }


PoolProvider = Callable[[], GenerationPool]


class TaskData:
    """One task's items for one split: size known up front, items made on demand.

    ``item(p)`` / ``get(p)`` block only for position ``p``; ``all_items()`` fills every
    position. Completed chunks of :data:`~mtgrpo.tasks.cache.CHUNK_SIZE` positions are
    written to the cache, whichever path generated them.
    """

    def __init__(
        self,
        spec: TaskSpec,
        *,
        split: str,
        seed: int,
        size: int,
        render: RenderOptions,
        pool: PoolProvider,
        cache: ItemCache | None,
        max_retries: int = 3,
        exclude_keys: frozenset[str] = frozenset(),
    ) -> None:
        self.spec = spec
        self.split = split
        self.seed = seed
        self.size = size
        self.render = render
        self.max_retries = max_retries
        # Source indices [0, span): position p tries p, p + n, p + 2n, ...
        self.span = (max_retries + 1) * size
        self.exclude_keys = exclude_keys
        self.cache = cache
        self.stats = GenerationStats()
        self._pool = pool
        self._lock = threading.RLock()
        self._items: dict[int, dict[str, Any]] = {}
        self._futures: dict[int, Future] = {}
        self._attempts: dict[int, Future] = {}
        self._complete_chunks: set[int] = set()
        self._missing_chunks: set[int] = set()  # not in the cache: read once, then generated
        self._urgent: set[int] = set()
        self._retries = threading.local()  # the per-thread retry queue of _attempt (see there)

    def __len__(self) -> int:
        return self.size

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    @property
    def num_chunks(self) -> int:
        return -(-self.size // CHUNK_SIZE)  # ceiling division: the last chunk may be short

    @property
    def ready_count(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, position: int) -> dict[str, Any]:
        """Row ``position`` (blocks only until that item exists)."""
        return self.render.row(self.spec, self.split, self.seed, self.item(position))

    def rows(self) -> list[dict[str, Any]]:
        """Every row, generating what is missing."""
        return [
            self.render.row(self.spec, self.split, self.seed, item) for item in self.all_items()
        ]

    def item(self, position: int) -> dict[str, Any]:
        """The stored item at ``position`` (format-independent; see :meth:`get`)."""
        if not isinstance(position, int | np.integer) or not 0 <= position < self.size:
            raise IndexError(
                f"position {position!r} out of range for {self.task_id} of size {self.size}"
            )
        position = int(position)
        with self._lock:
            stored = self._items.get(position)
        if stored is not None:
            return stored
        # The cache holds whole chunks: one read fills the rest of this chunk as well.
        if self.load_chunk(position // CHUNK_SIZE):
            return self._items[position]
        # On demand: overtakes queued background work (priority 1)
        future = self.future(position, priority=0)
        self._promote(position)  # an attempt already queued in the background moves ahead too
        return future.result()  # each attempt ends within item_timeout_s (workers=0: no limit)

    def all_items(self) -> list[dict[str, Any]]:
        for chunk in range(self.num_chunks):
            self.load_chunk(chunk)
        # Submit every missing position before waiting on any, so the workers run them in parallel.
        for position in range(self.size):
            if position not in self._items:
                self.future(position, priority=0)
        return [self.item(position) for position in range(self.size)]

    def chunk_range(self, chunk: int) -> range:
        return range(chunk * CHUNK_SIZE, min((chunk + 1) * CHUNK_SIZE, self.size))

    def load_chunk(self, chunk: int) -> bool:
        """Fill a chunk from memory or the cache; ``False`` if it must be generated."""
        with self._lock:
            if chunk in self._complete_chunks:
                return True
            if self.cache is None or chunk in self._missing_chunks:
                return False
        positions = self.chunk_range(chunk)
        items = self.cache.read_chunk(chunk, expected=len(positions))
        # Exactly its positions, in order; anything else is regenerated.
        valid = items is not None and [item.get("position") for item in items] == list(positions)
        with self._lock:
            if not valid:
                self._missing_chunks.add(chunk)
                return False
            for item in items:
                # an item another thread stored meanwhile wins: one item per position, ever
                self._items.setdefault(item["position"], item)
            self._complete_chunks.add(chunk)
            self.stats.loaded += len(items)
        return True

    def future(self, position: int, *, priority: int) -> Future:
        """The future of ``position``'s item, starting its generation if needed."""
        with self._lock:
            outer = self._futures.get(position)
            if outer is not None:
                return outer
            outer = Future()
            self._futures[position] = outer
        self._attempt(position, 0, priority, outer)
        return outer

    # ---------------------------------------------------------------- internals

    def _promote(self, position: int) -> None:
        """Move ``position`` ahead of background work, including its later replacements."""
        with self._lock:
            self._urgent.add(position)
            inner = self._attempts.get(position)
        if inner is not None:
            try:
                self._pool().promote(inner)
            except PoolClosedError:
                return

    def _attempt(self, position: int, attempt: int, priority: int, outer: Future) -> None:
        # An in-process pool (workers=0) settles an attempt inside submit, whose callback may
        # submit the next one: chained, hundreds of replacements would overflow the stack. A
        # retry asked for while this thread is submitting is queued for its loop instead.
        queued = getattr(self._retries, "queued", None)
        if queued is not None:
            queued.append((position, attempt, priority, outer))
            return
        self._retries.queued = queued = deque([(position, attempt, priority, outer)])
        try:
            while queued:
                self._submit_attempt(*queued.popleft())
        finally:
            self._retries.queued = None

    def _submit_attempt(self, position: int, attempt: int, priority: int,
                        outer: Future) -> None:
        # The replacement rule: p, p + n, p + 2n, ... (module docstring)
        source = position + attempt * self.size
        family = self.spec.family
        with self._lock:
            # A promoted position's replacements keep its on-demand priority.
            if position in self._urgent:
                priority = 0
        try:
            inner = self._pool().submit(
                family.generate,
                family.dataset,
                dict(self.spec.config),
                self.seed,
                self.span,
                source,
                priority=priority,
            )
        except PoolClosedError as error:
            outer.set_exception(error)
            return
        with self._lock:
            # the latest attempt: what _promote moves ahead of background work
            self._attempts[position] = inner
        inner.add_done_callback(
            functools.partial(self._attempt_done, position, attempt, priority, outer)
        )

    def _attempt_done(
        self, position: int, attempt: int, priority: int, outer: Future, inner: Future
    ) -> None:
        # A callback that raises would leave ``outer`` pending forever: settle it instead.
        try:
            self._settle(position, attempt, priority, outer, inner)
        except Exception as error:
            if not outer.done():
                outer.set_exception(error)

    def _settle(
        self, position: int, attempt: int, priority: int, outer: Future, inner: Future
    ) -> None:
        source = position + attempt * self.size
        error = inner.exception()
        if error is None:
            item = inner.result()
            key = self.spec.family.content_key
            if key is None or key(item["metadata"]) not in self.exclude_keys:
                self._accept(position, source, item, outer)
                return
            reason = "duplicates a problem of the evaluation split or of the excluded rows"
        # Only per-item failures are retried; a closed pool or a bug fails the position at once.
        elif isinstance(error, ItemTimeoutError | ItemFailedError):
            reason = str(error)
        else:
            outer.set_exception(error)
            return
        with self._lock:
            self.stats.skipped.append(SkippedItem(position, source, reason))
        if attempt < self.max_retries:
            self._attempt(position, attempt + 1, priority, outer)
            return
        tried = [position + r * self.size for r in range(self.max_retries + 1)]
        named = str(tried)
        if len(tried) > 8:  # a long search is named by its ends, not by every index
            named = f"[{tried[0]}, {tried[1]}, ..., {tried[-1]}] ({len(tried)} in all)"
        if error is None:  # the last one repeated an excluded problem
            fix = (f"The task's config may allow too few distinct problems for {self.size} "
                   f"beside the {len(self.exclude_keys)} excluded: widen the config, lower "
                   "train_size or eval_size, or raise max_retries")
        else:
            fix = "Raise max_retries, or item_timeout_s if items are merely slow"
        outer.set_exception(
            GenerationError(
                f"{self.task_id} ({self.split}) position {position}: every allowed source index "
                f"{named} was rejected; last reason: {reason}. {fix}"
            )
        )

    def _accept(self, position: int, source: int, item: dict[str, Any], outer: Future) -> None:
        stored = {"position": position, "source_index": source, **item}
        chunk = position // CHUNK_SIZE
        with self._lock:
            # the first item stored for a position is the one every reader gets
            stored = self._items.setdefault(position, stored)
            self.stats.generated += 1
            complete = chunk not in self._complete_chunks and all(
                p in self._items for p in self.chunk_range(chunk)
            )
            if complete:
                self._complete_chunks.add(chunk)
                items = [self._items[p] for p in self.chunk_range(chunk)]
        if complete and self.cache is not None:
            try:
                self.cache.write_chunk(chunk, items)
            # A read-only or full disk costs the caching, not the run.
            except OSError as error:
                warnings.warn(
                    f"could not write the task cache {self.cache.path}: {error}; continuing "
                    "without caching this chunk",
                    RuntimeWarning,
                    stacklevel=2,
                )
        outer.set_result(stored)


def _produce(datas: Sequence[TaskData], stop: threading.Event, window: int) -> None:
    """Background generation: chunks interleaved across tasks, ``window`` chunks in flight."""
    # Chunk 0 of every task, then chunk 1 of every task, ...: no task waits for a slow one.
    order = [
        (data, chunk)
        for chunk in range(max((d.num_chunks for d in datas), default=0))
        for data in datas
        if chunk < data.num_chunks
    ]
    pending: deque[list[Future]] = deque()
    for data, chunk in order:
        if stop.is_set():
            return
        if data.load_chunk(chunk):
            continue
        pending.append([data.future(p, priority=1) for p in data.chunk_range(chunk)])
        while len(pending) >= window and not stop.is_set():
            # the oldest chunk must finish before another is queued: at most `window` in flight
            wait(pending.popleft())
    while pending and not stop.is_set():
        wait(pending.popleft())


class SuiteSplit:
    """One split of a suite: its tasks' items concatenated, task by task.

    Prompt id ``i`` belongs to task ``prompt_tasks[i]`` (an index into ``task_ids``);
    ``get(i)`` / ``split[i]`` returns the row, blocking only for item ``i``.
    """

    def __init__(self, name: str, datas: Sequence[TaskData], workers: int) -> None:
        self.name = name
        self.tasks = list(datas)
        self.task_ids = [data.task_id for data in datas]
        sizes = [len(data) for data in datas]
        # [num_tasks + 1]: task t holds ids [offsets[t], offsets[t + 1])
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.prompt_tasks = np.repeat(np.arange(len(datas)), sizes)  # [num_prompts]
        # chunks in flight: about two items per worker, plus two chunks
        self._window = max(2, 2 * workers // CHUNK_SIZE + 2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def locate(self, prompt_id: int) -> tuple[TaskData, int]:
        """The task data and position of a prompt id."""
        if not 0 <= prompt_id < len(self):
            raise IndexError(
                f"prompt id {prompt_id} out of range for split {self.name!r} of size {len(self)}"
            )
        task = int(self.prompt_tasks[prompt_id])
        return self.tasks[task], int(prompt_id - self._offsets[task])

    def get(self, prompt_id: int) -> dict[str, Any]:
        data, position = self.locate(prompt_id)
        return data.get(position)

    def __getitem__(self, prompt_id: int) -> dict[str, Any]:
        return self.get(prompt_id)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for prompt_id in range(len(self)):
            yield self.get(prompt_id)

    def task(self, task_id: str) -> TaskData:
        if task_id not in self.task_ids:
            raise ValueError(
                f"unknown task {task_id!r}; this split has: {', '.join(self.task_ids)}"
            )
        return self.tasks[self.task_ids.index(task_id)]

    @property
    def ready_count(self) -> int:
        return sum(data.ready_count for data in self.tasks)

    @property
    def done(self) -> bool:
        return self.ready_count == len(self)

    def start(self) -> SuiteSplit:
        """Generate every item in a background thread (idempotent); returns ``self``."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=_produce,
                args=(self.tasks, self._stop, self._window),
                name=f"mtgrpo-{self.name}-producer",
                # An unfinished background split never holds up the interpreter's exit.
                daemon=True,
            )
            self._thread.start()
        return self

    def rows(self) -> list[dict[str, Any]]:
        """Every row (generates what is missing; blocks until done)."""
        return [row for data in self.tasks for row in data.rows()]

    def stop(self) -> None:
        self._stop.set()


def problem_keys(spec: TaskSpec, rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The content keys of the rows of ``spec``'s family (empty for a family without one):
    two problems with the same key are the same problem, whatever task or split holds them."""
    key = spec.family.content_key
    keys: set[str] = set()
    if key is None:
        return keys
    for row in rows:
        metadata = row.get("metadata", {})
        # A JSON string in a row (row schema); a dict is accepted too.
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        if metadata.get("family") == spec.family.name:
            keys.add(key(metadata))
    return keys


class TaskSuite:
    """Tasks, prompt options, reward scheme, and their lazily generated splits.

    ``suite.train`` / ``suite.eval`` are :class:`SuiteSplit` objects of ``train_size`` /
    ``eval_size`` items per task, ``suite.validation`` one of ``validation_size`` (``None``
    when it is 0, the default); ``suite.reward_routing`` maps each task id to its
    reward functions (TRL contract). Close the suite (or use ``with``) to stop its
    generation workers.
    """

    def __init__(
        self,
        tasks: Sequence[str | Mapping[str, Any] | TaskSpec],
        *,
        seed: int = 0,
        train_size: int = 10_000,
        eval_size: int = 200,  # ALGORITHMS.md §6: 200 test prompts per task
        validation_size: int = 0,
        prompt_format: str = "plain",
        answer_format: str = "answer_tag",
        think_prefix: bool = False,
        system_prompt: str | None = None,
        reward_scheme: RewardScheme | None = None,
        exclude: Iterable[Mapping[str, Any]] = (),
        exclude_eval: Iterable[Mapping[str, Any]] = (),
        cache_dir: str | None = None,
        use_cache: bool = True,
        workers: int | None = None,
        item_timeout_s: float = DEFAULT_ITEM_TIMEOUT_S,
        max_retries: int = 3,
    ) -> None:
        # A lone task id is iterable too: it must come in a list.
        if isinstance(tasks, str | Mapping) or not tasks:
            raise ValueError(f"tasks must be a non-empty list of task ids/specs, got {tasks!r}")
        self.tasks = [resolve_task(task) for task in tasks]
        self.task_ids = [spec.task_id for spec in self.tasks]
        duplicates = sorted({t for t in self.task_ids if self.task_ids.count(t) > 1})
        if duplicates:
            raise ValueError(f"duplicate task ids {duplicates}; give each task a distinct 'name'")
        check_split_sizes({"train_size": train_size, "eval_size": eval_size,
                           "validation_size": validation_size}, max_retries)
        self.sizes = {"train": train_size, "eval": eval_size, "validation": validation_size}
        self.seeds = {split: split_seed(seed, split) for split in SPLITS}
        self.seed = seed
        self.render = RenderOptions(prompt_format, answer_format, think_prefix, system_prompt)
        self.reward_scheme = reward_scheme or RewardScheme()
        self.exclude_rows = list(exclude)
        self.exclude_eval_rows = list(exclude_eval)
        self.cache_dir = cache_dir
        self.use_cache = use_cache
        self.max_retries = max_retries
        # Lazy: no worker process starts until the first item is asked for.
        self._pool = GenerationPool(workers, item_timeout_s=item_timeout_s)
        self._splits: dict[str, SuiteSplit] = {}
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_name(cls, name: str, **options: Any) -> TaskSuite:
        """A named suite (see :data:`SUITES`: ``mtgrpo3``, ``mtgrpo9``, …)."""
        return cls(SUITES.get(name), **options)

    @property
    def train(self) -> SuiteSplit:
        return self.split("train")

    @property
    def eval(self) -> SuiteSplit:
        return self.split("eval")

    @property
    def validation(self) -> SuiteSplit | None:
        """The validation split, or ``None`` without one (``validation_size=0``)."""
        return self.split("validation") if self.sizes["validation"] else None

    def split(self, name: str) -> SuiteSplit:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; valid splits: {', '.join(SPLITS)}")
        if not self.sizes[name]:
            raise ValueError(f"this suite has no {name} split; set {name}_size (items per task)")
        with self._lock:
            existing = self._splits.get(name)
        if existing is not None:
            return existing
        # Outside the lock: a training split builds the evaluation split first (_excluded_keys).
        datas = [self._task_data(spec, name) for spec in self.tasks]
        with self._lock:
            # Threads racing here all get the first split stored.
            return self._splits.setdefault(name, SuiteSplit(name, datas, self._pool.workers))

    def _held_out_keys(self, spec: TaskSpec, split: str) -> set[str]:
        """Content keys of ``spec``'s items in ``split`` (generating them)."""
        key = spec.family.content_key
        assert key is not None
        return {key(item["metadata"]) for item in self.split(split).task(spec.task_id).all_items()}

    def _excluded_keys(self, spec: TaskSpec, split: str) -> set[str]:
        """The problems ``split`` of ``spec`` leaves out (see the module docstring)."""
        if split == "eval":
            # Drawn from the whole distribution: leaves out only exclude_eval rows.
            return problem_keys(spec, self.exclude_eval_rows)
        if spec.family.content_key is None:
            return set()
        exclude = self._held_out_keys(spec, "eval")
        if split == "train":
            exclude |= problem_keys(spec, self.exclude_rows)
            if self.sizes["validation"]:
                exclude |= self._held_out_keys(spec, "validation")
        return exclude

    def _task_data(self, spec: TaskSpec, split: str) -> TaskData:
        excluded = frozenset(self._excluded_keys(spec, split))
        # The excluded problems decide which source indices are accepted, so they key the cache.
        digest = (
            hashlib.sha256("\n".join(sorted(excluded)).encode()).hexdigest() if excluded else ""
        )
        cache_key = CacheKey(
            family=spec.family.name,
            dataset=spec.family.dataset,
            level=spec.level,
            config_json=spec.config_json,
            seed=self.seeds[split],
            size=self.sizes[split],
            max_retries=self.max_retries,
            exclude_digest=digest,
        )
        return TaskData(
            spec,
            split=split,
            seed=self.seeds[split],
            size=self.sizes[split],
            render=self.render,
            pool=self._provide_pool,
            cache=ItemCache(cache_key, self.cache_dir) if self.use_cache else None,
            max_retries=self.max_retries,
            exclude_keys=excluded,
        )

    def _provide_pool(self) -> GenerationPool:
        if self._closed:
            raise PoolClosedError(
                "this task suite is closed; items not yet generated are unavailable"
            )
        return self._pool

    @property
    def reward_functions(self) -> list[TaskReward]:
        """One reward function per family in the suite (each returns None for other families)."""
        routing = self.reward_routing
        # Tasks of one family share one function (reward_routing)
        unique = {id(fn): fn for fns in routing.values() for fn in fns}
        return list(unique.values())

    @property
    def reward_routing(self) -> dict[str, list[TaskReward]]:
        """``{task_id: [reward_fn]}`` for the reward suite's routing."""
        return reward_routing(
            self.tasks, scheme=self.reward_scheme, answer_format=self.render.answer_format
        )

    def close(self) -> None:
        """Stop background generation and the workers; generated items stay readable."""
        self._closed = True
        for split in list(self._splits.values()):
            split.stop()
        self._pool.close()

    def __enter__(self) -> TaskSuite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_split_sizes(sizes: Mapping[str, int], max_retries: int) -> None:
    """Split sizes (``{"train_size": n, ...}``) and ``max_retries`` a suite can draw: positive
    integers (``validation_size``: 0 for none) whose source indices stay below the stride
    between split seeds."""
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    for name, size in sizes.items():
        # False == 0, so a bool is refused explicitly.
        if name == "validation_size" and size == 0 and not isinstance(size, bool):
            continue  # no validation split
        _check_size(name, size, max_retries)


def _check_size(name: str, size: int, max_retries: int) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        none = " or 0 (no validation split)" if name == "validation_size" else ""
        raise ValueError(f"{name} must be a positive integer{none} (items per task), got "
                         f"{size!r}")
    if (max_retries + 1) * size > SPLIT_SEED_STRIDE:
        raise ValueError(
            f"{name}={size} with max_retries={max_retries} needs {(max_retries + 1) * size} "
            f"source indices, more than the {SPLIT_SEED_STRIDE} between split seeds; "
            "use a smaller size"
        )


SUITES: Registry[tuple[str, ...]] = Registry("task suite")
SUITES.add(
    "mtgrpo3",
    # The MT-GRPO paper's Experiment 1 (docs/recipes.md)
    ("countdown:medium", "zebra_puzzles:medium", "arc_1d:medium"),
    aliases=("paper3", "exp1"),
)
SUITES.add(
    "mtgrpo9",
    # The MT-GRPO paper's Experiment 2: the three families at every level.
    tuple(
        f"{family}:{level}"
        for family in ("countdown", "zebra_puzzles", "arc_1d")
        for level in ("easy", "medium", "hard")
    ),
    aliases=("paper9", "exp2"),
)


def make_suite(
    tasks: str | Sequence[str | Mapping[str, Any] | TaskSpec], **options: Any
) -> TaskSuite:
    """A :class:`TaskSuite` from a suite name (``"mtgrpo3"``) or a list of tasks."""
    if isinstance(tasks, str):
        if tasks in SUITES:
            return TaskSuite.from_name(tasks, **options)
        return TaskSuite([tasks], **options)
    return TaskSuite(tasks, **options)


@dataclass(frozen=True)
class GenerationRate:
    """Measured generation speed of one task."""

    task_id: str
    items: int
    seconds: float
    workers: int

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


def measure_generation(
    task: str | Mapping[str, Any] | TaskSpec, items: int = 100, *, workers: int = 0, seed: int = 0
) -> GenerationRate:
    """Time the generation of ``items`` items of ``task`` (no cache; includes worker start-up)."""
    spec = resolve_task(task)
    _check_size("items", items, 0)
    with GenerationPool(workers) as pool:
        data = TaskData(
            spec,
            split="train",
            seed=split_seed(seed, "train"),
            size=items,
            render=RenderOptions(),
            pool=lambda: pool,
            cache=None,
        )
        start = time.perf_counter()
        data.all_items()
        seconds = time.perf_counter() - start
    return GenerationRate(spec.task_id, items, seconds, workers)
