"""Re-export the tiny-model session fixtures of ``tests/models/conftest.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_path = Path(__file__).parent.parent / "models" / "conftest.py"
_spec = importlib.util.spec_from_file_location("mtgrpo_tests_models_conftest", _path)
assert _spec is not None
assert _spec.loader is not None
_models_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_models_conftest)

tiny_model_dir = _models_conftest.tiny_model_dir
tiny_qwen2_model_dir = _models_conftest.tiny_qwen2_model_dir
tiny_gguf_file = _models_conftest.tiny_gguf_file
