"""One training step under `accelerate launch` (``--fsdp``: fully sharded; launched with
DeepSpeed: its ZeRO stage; ``--one-group``: a batch of one group with a gradient, loss ``grpo``,
plain SGD, so a process trains a padding group; ``--uneven`` / ``--fillers``: shares of 8 and 4
rows in 6 / 3 optimizer steps, top_entropy_quantile; ``--sync-ref``: beta 0.04 and the
reference model mixed towards the policy after the step); the main process writes what it
saw."""

from __future__ import annotations

import json
import sys

import torch
import trainer_helpers

from mtgrpo import GRPOTrainer


def main() -> None:
    model, out = sys.argv[1], sys.argv[2]
    fsdp = "full_shard" if "--fsdp" in sys.argv[3:] else None
    # SGD without clipping: the step is proportional to the gradient (Adam's first step is
    # nearly its sign, and clipping to norm 1 would equalise two gradients of norm > 1)
    batch = {"prompts_per_step": 1, "loss_type": "grpo", "optim": "sgd", "max_grad_norm": 0.0,
             "batch_construction": "dynamic"} if "--one-group" in sys.argv[3:] else \
        {"prompts_per_step": 6, "batch_construction": "ratio_preserving",
         "batch_construction_params": {"max_resample_rounds": 1}}
    uneven = {"--uneven": 6, "--fillers": 3}
    for flag, steps in uneven.items():
        if flag in sys.argv[3:]:
            # 3 groups of 4 rows: 8 rows on one process, 4 on the other; micro-batches of 1
            # row and the entropy quantile's gather in each. In 6 optimizer steps two parts
            # are empty on the second process; in 3 its second part is 1 row against 3, so
            # two filler passes, the first of them not the step's last
            batch.update(prompts_per_step=3, steps_per_generation=steps,
                         per_device_train_batch_size=1, top_entropy_quantile=0.5,
                         max_steps=2 * steps)  # TRL's optimizer steps: 2 batches
    if "--sync-ref" in sys.argv[3:]:  # TR-DPO's reference update after every step
        batch.update(beta=0.04, sync_ref_model=True, ref_model_sync_steps=1)
    batch.setdefault("max_steps", 1)
    args = trainer_helpers.args(out, save_rollouts=True,
                                task_weighting="mt_grpo", task_weighting_params={"lam": 0.5},
                                fsdp=fsdp, **batch)
    trainer = GRPOTrainer(model, [trainer_helpers.alpha_reward, trainer_helpers.beta_reward],
                          args=args, train_dataset=trainer_helpers.rows(),
                          generation_backend="scripted_backend:ScriptedBackend")
    initial = None if trainer.sharded or trainer.zero is not None else \
        {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    trainer.train()
    # a sharded (or DeepSpeed) model's whole weights are gathered on the main process (every
    # process calls)
    weights = trainer._whole_weights()
    if weights is None:
        weights = dict(trainer.unwrapped.named_parameters())
    if trainer.is_main_process:
        digest = sum(float(p.detach().double().sum()) for p in weights.values())
        result = {"weights": trainer.weighting.weights.tolist(), "world": trainer.world,
                  "param_sum": digest, "sharded": trainer.sharded,
                  "sharded_head": type(trainer.unwrapped.lm_head.weight).__name__,
                  # ZeRO-3: outside a forward each process holds an empty partition
                  "head_numel": trainer.unwrapped.lm_head.weight.numel(),
                  "zero_stage": None if trainer.zero is None else trainer.zero.stage,
                  # how far the step moved the weights: sum of |w - w0|
                  "ref_sum": None if trainer.ref_model is None else sum(
                      float(p.detach().double().sum()) for p in trainer.ref_model.parameters()),
                  "moved": None if initial is None else sum(
                      float((p.detach() - initial[n]).abs().double().sum())
                      for n, p in weights.items())}
        with open(f"{out}/result.json", "w") as handle:
            json.dump(result, handle)
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    trainer_helpers.run_and_leave(main)
