"""Fixtures shared by the policy tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def single_process_group(tmp_path):
    """A one-process gloo group on CPU, enough to build a real DistributedDataParallel or an
    FSDP2-sharded model."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available in this build")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    torch.distributed.destroy_process_group()
