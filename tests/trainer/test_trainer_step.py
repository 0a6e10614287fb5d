"""The training step's seams: the sampler hands back everything it generated, and each advantage
is computed once (a batch-level estimator runs a second time, on the trained batch only)."""

from __future__ import annotations

import numpy as np
import pytest
import trainer_helpers as _common

from mtgrpo import GRPOTrainer
from mtgrpo.algo.advantages import compute_advantages
from mtgrpo.trainer.update import batch_advantages


def _instrumented(tiny_model_dir, tmp_path, **overrides):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [_common.alpha_reward, _common.beta_reward],
        args=_common.args(tmp_path, max_steps=1, batch_construction="dynamic",
                          batch_construction_params={"oversample_factor": 1.5,
                                                     "max_resample_rounds": 2},
                          zero_gradient_filter="lenient", **overrides),
        train_dataset=_common.rows(),
    )
    estimated, builds = [], []
    estimate, build = trainer.estimate, trainer.sampler.build

    def counting(rewards, group_size):
        estimated.append(len(rewards))
        return estimate(rewards, group_size)

    def recording(*args, **kwargs):
        builds.append(build(*args, **kwargs))
        return builds[-1]

    trainer.estimate = trainer.rollouts.estimate = counting
    trainer.sampler.build = recording
    return trainer, estimated, builds


def test_each_advantage_is_computed_once(tiny_model_dir, tmp_path):
    trainer, estimated, builds = _instrumented(tiny_model_dir, tmp_path)
    trainer.train()
    [built] = builds
    rows = sum(g.group_size for g in built.generated)
    assert sum(estimated) == rows  # every generated completion once, by the rollout worker
    assert built.report.rounds == len(estimated)  # once per generation round
    assert all(g.advantages is not None for g in built.generated)
    # the group-local estimator: the batch's advantages are each group's own, exactly what an
    # estimator run on the kept groups alone gives
    kept = np.concatenate([g.rewards for g in built.groups])
    again = compute_advantages(kept, 4, reward_weights=trainer.rewards.reward_weights,
                               on_unscorable=trainer.on_unscorable).advantages
    assert np.array_equal(batch_advantages(built.groups), again)


@pytest.mark.parametrize("overrides", [{"scale_rewards": "batch"},
                                       {"multi_objective_aggregation": "gdpo"}])
def test_a_batch_level_estimator_runs_again_on_the_trained_batch(tiny_model_dir, tmp_path,
                                                                 overrides):
    trainer, estimated, builds = _instrumented(tiny_model_dir, tmp_path, **overrides)
    trainer.train()
    [built] = builds
    rows = sum(g.group_size for g in built.generated)
    kept = sum(g.group_size for g in built.groups)
    assert sum(estimated) == rows + kept  # the second pass is over the trained batch only
    assert estimated[-1] == kept
