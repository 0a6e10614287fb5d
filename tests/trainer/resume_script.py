"""Run a short training in a subprocess; optionally SIGKILL (or SIGTERM) itself at the start
of a step.

Usage: python resume_script.py MODEL_DIR OUTPUT_DIR [--kill-at STEP] [--term-at STEP]
    [--resume] [--num-generations G] [--allow FIELD ...] [--validation] [--fsdp] [--whole]
    [--lr-scheduler TYPE] [--backend NAME] [--max-steps N]

``--validation``: the task weights read a held-out validation split every 3 steps
(``task_weighting_signal: validation``). ``--fsdp``: the whole model trained fully sharded
(``fsdp="full_shard"``, under ``accelerate launch``) instead of a LoRA adapter; ``--whole``: the
whole model, as the launch trains it (DeepSpeed ZeRO under ``accelerate launch --use_deepspeed``);
``--lr-scheduler``: the learning-rate schedule (default: the helpers' constant one);
``--backend``: the generation backend (default: auto); ``--max-steps``: default 6.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import trainer_helpers

from mtgrpo import GRPOTrainer


class KillingTrainer(GRPOTrainer):
    kill_at: int | None = None
    term_at: int | None = None

    def training_step(self):
        if self.kill_at is not None and self.step + 1 == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a real crash: no cleanup, no final save
        if self.term_at is not None and self.step + 1 == self.term_at:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption, as a cluster sends it
        return super().training_step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("output_dir")
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--term-at", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--allow", nargs="*")
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--whole", action="store_true")
    parser.add_argument("--lr-scheduler")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--max-steps", type=int, default=6)
    options = parser.parse_args()
    held_out = {"task_weighting_signal": "validation", "validation_steps": 3,
                "num_generations_validation": 2} if options.validation else {}
    args = trainer_helpers.args(
        options.output_dir, max_steps=options.max_steps, save_steps=2, save_total_limit=None,
        save_rollouts=True, log_completions=True,
        task_weighting="mt_grpo", task_weighting_params={"lam": 0.5, "optimizer": "adam"},
        batch_construction="ratio_preserving",
        batch_construction_params={"max_resample_rounds": 2},
        resume_from_checkpoint=True if options.resume else None,
        num_generations=options.num_generations, resume_allow_changes=options.allow,
        fsdp="full_shard" if options.fsdp else None, **held_out,
        **({"lr_scheduler_type": options.lr_scheduler} if options.lr_scheduler else {}),
        generation_backend=options.backend,
    )
    KillingTrainer.kill_at, KillingTrainer.term_at = options.kill_at, options.term_at
    trainer = KillingTrainer(
        options.model, [trainer_helpers.alpha_reward, trainer_helpers.beta_reward], args=args,
        train_dataset=trainer_helpers.rows(),
        peft_config=None if options.fsdp or options.whole else {"r": 4},
        validation_dataset=trainer_helpers.validation_rows() if options.validation else None,
    )
    trainer.train()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    trainer_helpers.run_and_leave(main)
