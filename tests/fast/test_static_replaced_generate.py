"""The static backend honours a ``generate`` replaced on the model object after it was built
(TRL's tests patch ``trainer.model.generate``): generation goes through the replacement."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import torch

from mtgrpo.rollout import SamplingParams, StaticCacheBackend


def test_a_generate_replaced_on_the_model_is_what_samples(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    backend = StaticCacheBackend(model, eos_token_ids=[258])

    def fake_generate(input_ids: torch.Tensor, **kwargs: object) -> torch.Tensor:
        rows = torch.tensor([[5, 6, 258, 256], [7, 8, 9, 10]])[: input_ids.shape[0]]
        return torch.cat([input_ids, rows], dim=-1)

    params = SamplingParams(max_new_tokens=4)
    with patch.object(model, "generate", side_effect=fake_generate) as mocked:
        out = backend.generate([[1, 2, 3]], params, num_samples=2)
    assert mocked.call_count == 1
    assert out.completion_ids == [[5, 6, 258], [7, 8, 9, 10]]
    assert out.finished == [True, False]
    assert "generate" not in vars(model)  # restored: the engine decodes again
    assert len(backend.generate([[1, 2, 3]], params).completion_ids) == 1
