"""mtgrpo: multi-task, multi-reward GRPO post-training of language models.

The algorithm core (``mtgrpo.advantages``, ``mtgrpo.weighting``, ``mtgrpo.sampling``,
``mtgrpo.rewards``, ``mtgrpo.analysis``) is importable without loading any model code.
"""

from __future__ import annotations

__version__ = "0.1.0"
