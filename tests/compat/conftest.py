"""Fixtures of the TRL test port: the stand-in hub (models and the zen dataset), offline.

Every test here runs with the Hugging Face hub cache pointed at a session directory of
locally built stand-ins (:mod:`standins`), offline mode on, and ``load_dataset`` of the test
module serving the zen stand-in for ``trl-internal-testing/zen`` (other names go to
``datasets.load_dataset`` unchanged). The tests in :data:`FULL_VOCABULARY` get the stand-ins
with the real vocabularies (they name Qwen2.5's token ids, or need the EOS token as rare as
in a real vocabulary), and so does every test of ``test_trl_grpo_tools`` (TRL's tool tests
write completions as Qwen2.5 token ids); the others the compact ones. The multiprocessing
start method, which one TRL test sets globally, is restored after each test.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from . import standins

FULL_VOCABULARY = {"test_train_with_mask_truncated_completions",
                   "test_train_with_mask_truncated_completions_all_masked"}
FULL_VOCABULARY_MODELS = ("tiny-Qwen2ForCausalLM-2.5", "tiny-Qwen2ForSequenceClassification-2.5",
                          "tiny-Qwen3ForCausalLM", "tiny-Qwen3MoeForCausalLM")
FULL_VOCABULARY_MODULES = ("test_trl_grpo_tools",)


class StandinHub:
    """Hub caches of stand-ins, built on first use (compact: all models; full: those the
    :data:`FULL_VOCABULARY` tests load)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tokenizers: dict[Any, Any] = {}
        self.built: dict[bool, Path] = {}

    def cache(self, full: bool) -> Path:
        if full not in self.built:
            cache = self.root / ("trl-standin-hub-full" if full else "trl-standin-hub")
            names = FULL_VOCABULARY_MODELS if full else standins.standin_names()
            for name in names:
                standins.build_model(cache, name, self.tokenizers, full=full)
            if not full:
                standins.build_remote_model(cache, self.tokenizers)
            self.built[full] = cache
        return self.built[full]


@pytest.fixture(scope="session")
def trl_hub(tmp_path_factory: pytest.TempPathFactory) -> StandinHub:
    return StandinHub(tmp_path_factory.getbasetemp())


def _zen_loader(original: Any) -> Any:
    from datasets import Dataset, DatasetDict

    def load_dataset(path: str, name: str | None = None, split: str | None = None,
                     streaming: bool = False, **kwargs: Any) -> Any:
        if path != f"{standins.ORG}/zen":
            return original(path, name, split=split, streaming=streaming, **kwargs)
        splits = {s: Dataset.from_list(standins.zen_split(name, s)) for s in ("train", "test")}
        if streaming:
            splits = {s: d.to_iterable_dataset() for s, d in splits.items()}
        if split is not None:
            return splits[split]
        if streaming:
            from datasets import IterableDatasetDict

            return IterableDatasetDict(splits)
        return DatasetDict(splits)

    return load_dataset


@pytest.fixture(autouse=True)
def trl_standins(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                 trl_hub: StandinHub, tmp_path_factory: pytest.TempPathFactory) -> Any:
    import huggingface_hub.constants as hub_constants
    import transformers.dynamic_module_utils as dynamic

    if not request.module.__name__.endswith(("test_trl_grpo_trainer", "test_seed_snippets",
                                             "test_trl_grpo_vllm", *FULL_VOCABULARY_MODULES)):
        yield
        return
    full = request.node.originalname in FULL_VOCABULARY or \
        request.module.__name__.endswith(FULL_VOCABULARY_MODULES)
    if request.module.__name__.endswith("test_trl_grpo_vllm"):
        from . import vllm_standins

        vllm_standins.build(trl_hub.cache(full), trl_hub.tokenizers)
    # the end-of-run report (figures and summary, 1-5 s a run) is tested on its own
    # (tests/trainer/test_trainer_first_hour.py); TRL's tests call train() about a hundred
    # times for what the steps do, so here it is left out
    from mtgrpo.trainer.trainer import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "_report_at_end", lambda self: None)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(trl_hub.cache(full)))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    modules = tmp_path_factory.getbasetemp() / "trl-standin-modules"
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(modules))
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", _zen_loader(datasets.load_dataset))
    if hasattr(request.module, "load_dataset"):
        monkeypatch.setattr(request.module, "load_dataset",
                            _zen_loader(request.module.load_dataset))
    method = multiprocessing.get_start_method(allow_none=True)
    yield
    if multiprocessing.get_start_method(allow_none=True) != method:
        multiprocessing.set_start_method(method or multiprocessing.get_all_start_methods()[0],
                                         force=True)
