"""The tasks section's validation split option."""

from __future__ import annotations

import pytest

from mtgrpo.tasks import TasksConfig


def test_validation_size_reaches_the_suite_and_zero_means_none(tmp_path):
    config = TasksConfig(tasks=["countdown:easy"], validation_size=3, train_size=4, eval_size=2,
                         workers=0, cache_dir=str(tmp_path))
    assert TasksConfig(tasks=["countdown:easy"]).validation_size == 0
    with config.build_suite() as suite:
        assert len(suite.validation) == 3
    with config.build_suite(validation_size=0) as suite:
        assert suite.validation is None


def test_a_negative_validation_size_names_the_option_and_the_fix():
    with pytest.raises(ValueError, match=r"validation_size must be a positive integer or 0 "
                       r"\(no validation split\) \(items per task\), got -2"):
        TasksConfig(tasks=["countdown:easy"], validation_size=-2)
