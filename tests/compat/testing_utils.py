"""The helpers TRL's ``tests/testing_utils.py`` gives its GRPO tests, for the port beside it.

Only the names ``test_trl_grpo_trainer.py`` imports: the per-test temporary directory of
``TrlTestCase`` and the skip markers for optional hardware and packages (written for mtgrpo's
environment: no vLLM, liger, bitsandbytes, vision extras or accelerator on the CI machine).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


class TrlTestCase:
    """Gives every test ``self.tmp_dir``, a fresh temporary directory."""

    @pytest.fixture(autouse=True)
    def set_tmp_dir(self, tmp_path):
        self.tmp_dir = str(tmp_path)


def is_ampere_or_newer(device_index: int = 0) -> bool:
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


require_bitsandbytes = pytest.mark.skipif(not _installed("bitsandbytes"),
                                          reason="test requires bitsandbytes")
# TRL needs jmespath for its legacy response parser (transformers < 5.13); mtgrpo parses tool
# calls itself, so the tool tests run without it
require_jmespath = pytest.mark.skipif(False, reason="mtgrpo does not need jmespath")
require_kernels = pytest.mark.skipif(not _installed("kernels"), reason="test requires kernels")
require_liger_kernel = pytest.mark.skipif(not _installed("liger_kernel"),
                                          reason="test requires liger-kernel")
require_peft = pytest.mark.skipif(not _installed("peft"), reason="test requires peft")
require_torch_accelerator = pytest.mark.skipif(not torch.cuda.is_available(),
                                               reason="test requires accelerator")
require_vision = pytest.mark.skipif(not _installed("PIL"), reason="test requires vision")
require_vllm = pytest.mark.skipif(not _installed("vllm"), reason="test requires vllm")
