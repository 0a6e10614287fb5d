"""Steps counted as TRL 1.16 counts them through ``GRPOConfig``, and in generation batches
through ``TrainConfig`` (run files), with the transformers state in optimizer steps for both.

The first test is TRL's ``test_prepare_input_called_with_correct_data`` (whose patch of the HF
``Trainer.training_step(model, inputs)`` has no counterpart here) answered with the same
counts: its ``gradient_accumulation_steps=3`` becomes 2, because an optimizer step of mtgrpo's
never takes micro-batches from two generation batches (refused below, with the fix).
"""

from __future__ import annotations

import json
import math

import pytest
import trainer_helpers as common
from transformers import TrainerCallback

from mtgrpo import GRPOConfig, GRPOTrainer, TrainConfig
from mtgrpo.trainer.update import PolicyUpdater


def vowels(prompts, completions, **kwargs):
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


class StepEnds(TrainerCallback):
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.logged: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and "train_loss" not in logs:
            self.logged.append(state.global_step)


class Counting:
    """Wraps the updater: the rows of each optimizer step and the micro-batches' losses."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.optimizer_steps: list[int] = []
        self.micro_batches: list[int] = []
        step, loss = PolicyUpdater._optimizer_step, PolicyUpdater._loss

        def counted_step(updater, batch, rows, *args, **kwargs):
            self.optimizer_steps.append(len(rows))
            return step(updater, batch, rows, *args, **kwargs)

        def counted_loss(updater, scored, part, *args, **kwargs):
            self.micro_batches.append(part.num_rows)
            return loss(updater, scored, part, *args, **kwargs)

        monkeypatch.setattr(PolicyUpdater, "_optimizer_step", counted_step)
        monkeypatch.setattr(PolicyUpdater, "_loss", counted_loss)


def prompts(n: int = 17) -> list[dict]:
    return [{"prompt": f"Line {i} says"} for i in range(n)]


def rollout_order(run_dir) -> list[int]:
    return [json.loads(line)["prompt_id"]
            for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def test_grpo_config_counts_micro_batches_and_optimizer_steps_as_trl(tiny_model_dir, tmp_path,
                                                                      monkeypatch):
    counting, ends = Counting(monkeypatch), StepEnds()
    args = common.args(
        tmp_path, gradient_accumulation_steps=2, steps_per_generation=4, num_generations=4,
        per_device_train_batch_size=6, num_iterations=2, shuffle_dataset=False,
        prompts_per_step=None, max_steps=-1, num_train_epochs=3, max_completion_length=6,
        save_rollouts=True, logging_steps=8, save_steps=12, save_total_limit=None)
    trainer = GRPOTrainer(str(tiny_model_dir), [vowels], args=args, train_dataset=prompts(),
                          callbacks=[ends])
    # a generation batch: 6 completions x 4 micro-batches = 24 = 6 prompts x 4 generations
    assert trainer.prompts_per_step == 6
    out = trainer.train()
    # 3 epochs x 2 generation batches (17 prompts // 6), as TRL; the first two batches are
    # TRL's: prompts 0-5, then 6-11. Later ones read on through the dataset (TRL drops the
    # last 5 prompts of every epoch; mtgrpo's prompt pool wraps, visiting each prompt)
    assert trainer.step == 6
    assert rollout_order(tmp_path) == (list(range(17)) * 3)[:36]
    # 3 epochs x 2 batches x 2 iterations x 4 steps_per_generation = 48 micro-batches of 6
    assert counting.micro_batches == [6] * 48
    # ... and 48 / gradient_accumulation_steps = 24 optimizer steps of 12 completions
    assert counting.optimizer_steps == [12] * 24
    assert trainer.state.global_step == out.global_step == trainer.state.max_steps == 24
    assert ends.steps == list(range(1, 25))  # on_step_end once per optimizer step
    assert ends.logged == [8, 16, 24]  # logging_steps in optimizer steps
    assert sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*")) == [12, 24]
    assert trainer.state.epoch == 3.0


def test_grpo_config_max_steps_ends_inside_a_generation_batch(tiny_model_dir, tmp_path,
                                                              monkeypatch):
    counting = Counting(monkeypatch)
    args = common.args(
        tmp_path, gradient_accumulation_steps=1, steps_per_generation=2, num_generations=4,
        per_device_train_batch_size=4, num_iterations=2, prompts_per_step=None, max_steps=6,
        max_completion_length=6, lr_scheduler_type="linear", save_steps=500)
    trainer = GRPOTrainer(str(tiny_model_dir), [vowels], args=args, train_dataset=prompts())
    assert (trainer.max_steps, trainer.state.max_steps) == (2, 6)  # 4 optimizer steps a batch
    trainer.train()
    assert len(counting.optimizer_steps) == trainer.state.global_step == 6
    assert (tmp_path / "checkpoint-6").is_dir()  # named by global_step, as TRL's
    # the run's config.yaml says how it counted, so it loads back as the same run: the native
    # tree, counting optimizer steps, with 2 optimizer steps a generation batch
    from mtgrpo.config import load_run_config

    saved = load_run_config(tmp_path / "config.yaml").training
    assert type(saved) is TrainConfig
    assert saved.schedule.step_unit == "optimizer"
    assert (saved.schedule.max_steps, saved.batch.steps_per_generation,
            saved.training_steps()) == (6, 2, 2)
    # the linear schedule spans the 6 optimizer steps: it ends at zero
    assert trainer.scheduler.get_last_lr()[0] == 0.0


def test_run_files_count_generation_batches(tiny_model_dir, tmp_path, monkeypatch):
    counting, ends = Counting(monkeypatch), StepEnds()
    args = common.args(tmp_path, config_class=TrainConfig, steps_per_generation=2,
                       num_iterations=2, max_steps=2, logging_steps=1, save_steps=1,
                       save_total_limit=None, max_completion_length=6)
    trainer = GRPOTrainer(str(tiny_model_dir), [vowels], args=args,
                          train_dataset=prompts(), callbacks=[ends])
    trainer.train()
    # max_steps=2 generation batches of 2 optimizer steps x 2 iterations
    assert trainer.step == 2
    assert len(counting.optimizer_steps) == trainer.state.global_step == 8
    assert counting.optimizer_steps == [8] * 8  # 4 prompts x 4 completions / 2 steps
    assert ends.steps == list(range(1, 9))
    assert ends.logged == [4, 8]  # every training step
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-4",
                                                                      "checkpoint-8"]


def test_a_run_file_may_count_as_trl():
    from mtgrpo.compat import training_from_flat
    from mtgrpo.config import run_config_from_dict

    trl = run_config_from_dict({"step_counts": "trl", "gradient_accumulation_steps": 2,
                                "steps_per_generation": 4, "num_iterations": 2,
                                "max_steps": 6}, training_from_flat)
    assert type(trl.training) is TrainConfig  # the native tree, in TRL's units
    assert (trl.training.optimizer_steps_per_step(), trl.training.training_steps()) == (4, 2)
    assert trl.to_dict()["step_unit"] == "optimizer"
    assert trl.to_dict()["steps_per_generation"] == 2  # 4 micro-batches: 2 optimizer steps
    again = run_config_from_dict(trl.to_dict())  # the saved form loads back as the same run
    assert again.training == trl.training
    plain = run_config_from_dict({"steps_per_generation": 4, "max_steps": 6}, training_from_flat)
    assert type(plain.training) is TrainConfig
    assert plain.to_dict()["step_unit"] == "training"
    assert plain.training.total_optimizer_steps() == 24
    with pytest.raises(ValueError, match=r"step_counts='optimizer' must be one of training, "
                       r"trl"):
        run_config_from_dict({"step_counts": "optimizer"}, training_from_flat)


def test_an_optimizer_step_spanning_two_generation_batches_is_refused():
    with pytest.raises(ValueError, match=r"steps_per_generation=4 is not a multiple of "
                       r"gradient_accumulation_steps=3.*steps_per_generation=3 or 6"):
        GRPOConfig(gradient_accumulation_steps=3, steps_per_generation=4)
    with pytest.raises(ValueError, match=r"steps_per_generation=1 .* gradient_accumulation_"
                       r"steps=2.*steps_per_generation=2 or 4"):
        GRPOConfig(gradient_accumulation_steps=2, steps_per_generation=1)
    # the run files' unit has no such constraint: 3 optimizer steps of 2 micro-batches each
    assert TrainConfig.from_flat({"gradient_accumulation_steps": 2, "steps_per_generation": 3}) \
        .optimizer_steps_per_step() == 3
    assert math.isclose(GRPOConfig(gradient_accumulation_steps=2, steps_per_generation=6,
                                   num_iterations=2).optimizer_steps_per_step(), 6)


def test_mini_batch_parts_drop_only_the_parts_empty_on_every_process():
    from mtgrpo.trainer.update import mini_batch_parts

    # one process: 4 rows in 6 optimizer steps take 4 steps, as array_split leaves 2 empty
    assert mini_batch_parts(4, 6, largest=4) == [[0], [1], [2], [3]]
    # 4 rows here, 8 on another process: steps 5 and 6 have rows there, so here they are
    # filler passes (empty parts) taken together with it
    assert mini_batch_parts(4, 6, largest=8) == [[0], [1], [2], [3], [], []]
    assert mini_batch_parts(8, 6, largest=8) == [[0, 1], [2, 3], [4], [5], [6], [7]]
    # 4 rows on every process (the first case, on each): steps 5 and 6 are empty everywhere,
    # so no process takes them (an optimizer step on no gradient would still move AdamW)
    assert mini_batch_parts(3, 2, largest=5) == [[0, 1], [2]]
