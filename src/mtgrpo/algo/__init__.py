"""The method: multi-task GRPO's algorithm as pure functions and small stateful objects.

Nothing here loads or runs a model; every module can be read, tested and reused alone.

- :mod:`~mtgrpo.algo.registry`: the names users pick things by (and their registries).
- :mod:`~mtgrpo.algo.metrics`: each decision and metric defined once (numpy).
- :mod:`~mtgrpo.algo.advantages`: group-relative advantages over reward channels (numpy;
  torch tensors in give tensors out).
- :mod:`~mtgrpo.algo.weighting`: task-weighting strategies: MT-GRPO, SEC, worst-case (numpy).
- :mod:`~mtgrpo.algo.sampling`: batch construction that realises the task weights (numpy).
- :mod:`~mtgrpo.algo.losses`, :mod:`~mtgrpo.algo.token_weights`,
  :mod:`~mtgrpo.algo.engine_correction`: the GRPO loss family, its per-token weights and the
  generation engine's importance correction (torch).

This ``__init__`` imports nothing, so that ``mtgrpo.algo.registry`` (what the configuration reads)
stays free of torch.
"""
