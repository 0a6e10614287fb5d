"""TRL's trainer surface on the tiny model: single-task data, state and callbacks, epochs and
strategies, resuming by argument, the reward-function hooks, generation options, the Hub."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import trainer_helpers as common
from transformers import TrainerCallback, TrainerState

from mtgrpo import GRPOTrainer
from mtgrpo.policy import PolicyBatch
from mtgrpo.reporting import read_metrics


def single_task_rows(n: int = 6) -> list[dict]:
    return [{"prompt": f"Say {i}:", "target": "a"} for i in range(n)]


def vowels(prompts, completions, **kwargs):
    return [float(sum(ch in "aeiou" for ch in c)) for c in completions]


def _trainer(model, tmp_path, rows=None, rewards=None, **overrides):
    options = {"max_steps": 3, "num_generations": 3, "prompts_per_step": 2}
    options.update(overrides)
    return GRPOTrainer(str(model), rewards or [vowels],
                       args=common.args(tmp_path, **options),
                       train_dataset=rows if rows is not None else single_task_rows())


class Recorder(TrainerCallback):
    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.stop_at = stop_at

    def _record(self, name, state):
        self.events.append((name, state.global_step))

    def on_train_begin(self, args, state, control, **kwargs):
        self._record("train_begin", state)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._record("epoch_end", state)

    def on_step_end(self, args, state, control, **kwargs):
        self._record("step_end", state)
        if state.global_step == self.stop_at:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._record("log", state)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._record("evaluate", state)
        assert "eval_loss" in metrics

    def on_save(self, args, state, control, **kwargs):
        self._record("save", state)

    def on_train_end(self, args, state, control, **kwargs):
        self._record("train_end", state)


def test_data_without_a_task_column_trains_as_one_task(tiny_model_dir, tmp_path, caplog):
    def none_for_one(prompts, completions, **kwargs):
        return [None if p.startswith("Say 0") else 1.0 for p in prompts]

    trainer = _trainer(tiny_model_dir, tmp_path, rewards=[none_for_one], max_steps=6)
    assert trainer.task_names == ["default"]
    assert trainer.on_unscorable == "warn"  # TRL's behaviour for single-task data
    with caplog.at_level(logging.WARNING):
        out = trainer.train()
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert "tasks/default/accuracy" in out
    assert out["tasks/default/weight"] == 1.0


def test_state_callbacks_and_the_training_summary(tiny_model_dir, tmp_path):
    recorder = Recorder()
    trainer = GRPOTrainer(
        str(tiny_model_dir), [vowels], callbacks=[recorder],
        args=common.args(tmp_path, max_steps=4, num_generations=3, prompts_per_step=2,
                         save_steps=2, eval_steps=2, logging_steps=2, eval_on_start=False),
        train_dataset=single_task_rows(), eval_dataset=single_task_rows(2),
    )
    output = trainer.train()
    assert isinstance(trainer.state, TrainerState)
    assert trainer.state.global_step == output.global_step == 4
    steps_ended = [step for name, step in recorder.events if name == "step_end"]
    assert steps_ended == [1, 2, 3, 4]
    assert [e for e in recorder.events if e[0] in ("evaluate", "save")] == [
        ("evaluate", 2), ("save", 2), ("evaluate", 4), ("save", 4)]
    assert recorder.events[0] == ("train_begin", 0)
    assert recorder.events[-1] == ("train_end", 4)
    history = trainer.state.log_history
    assert [h["step"] for h in history if "eval_loss" in h] == [2, 4]
    assert [h["step"] for h in history if "loss" in h and "train_loss" not in h
            and "eval_loss" not in h] == [2, 4]
    final = history[-1]
    assert math.isfinite(final["train_loss"])
    train_losses = [r["loss"] for r in read_metrics(tmp_path, split="train")]
    # logged loss: the mean over the steps since the previous log (the Trainer's definition)
    assert len(train_losses) == 2
    assert final["train_loss"] == pytest.approx(sum(train_losses) / 2, rel=1e-6)
    assert final["clip_ratio/region_mean"] == final["clip_ratio/region"]  # TRL's names beside ours
    assert output.training_loss == final["train_loss"]


def test_a_callback_stops_training(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=6)
    trainer.add_callback(Recorder(stop_at=2))
    trainer.train()
    assert trainer.step == trainer.state.global_step == 2
    assert (tmp_path / "checkpoint-2").is_dir()  # a stopped run still ends with a checkpoint
    assert [r["step"] for r in read_metrics(tmp_path, split="train")] == [1, 2]


def test_epochs_shuffling_and_epoch_strategies(tiny_model_dir, tmp_path):
    recorder = Recorder()
    trainer = _trainer(
        tiny_model_dir, tmp_path, max_steps=-1, num_train_epochs=2, prompts_per_step=2,
        shuffle_dataset=False, save_rollouts=True, save_strategy="epoch", logging_strategy="epoch",
        save_total_limit=None)
    trainer.add_callback(recorder)
    trainer.train()
    assert trainer.max_steps == trainer.state.max_steps == 6  # 2 epochs of 6 prompts / 2
    order = [json.loads(line)["prompt_id"] for line in
             (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert order == [0, 1, 2, 3, 4, 5] * 2  # dataset order, epoch after epoch
    assert [s for name, s in recorder.events if name == "epoch_end"] == [3, 6]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3",
                                                                      "checkpoint-6"]
    assert [r["step"] for r in read_metrics(tmp_path, split="train")] == [3, 6]
    assert trainer.state.epoch == 2.0


def test_shuffled_order_visits_every_prompt_each_epoch(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=-1, num_train_epochs=2,
                       save_rollouts=True, data_seed=7)
    trainer.train()
    order = [json.loads(line)["prompt_id"] for line in
             (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(order[:6]) == sorted(order[6:]) == list(range(6))
    assert order[:6] != list(range(6))


def test_resume_from_checkpoint_argument_and_state(tiny_model_dir, tmp_path):
    first = _trainer(tiny_model_dir, tmp_path, max_steps=2, save_steps=1, save_total_limit=None)
    first.train()
    again = _trainer(tiny_model_dir, tmp_path, max_steps=3)
    again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert again.state.global_step == 3
    # the restored log history is the checkpoint's (step 1), then this run's steps 2 and 3
    train_steps = [h["step"] for h in again.state.log_history if "train_loss" not in h]
    assert train_steps == [1, 2, 3]
    model_only = _trainer(tiny_model_dir, tmp_path / "m", max_steps=1, save_only_model=True)
    model_only.train()
    assert (tmp_path / "m" / "checkpoint-1" / "model" / "model.safetensors").is_file()
    assert not (tmp_path / "m" / "checkpoint-1" / "optimizer.pt").exists()
    resumed = _trainer(tiny_model_dir, tmp_path / "m", max_steps=2)
    with pytest.raises(ValueError, match="save_only_model=True"):
        resumed.train(resume_from_checkpoint=True)


def test_best_model_tracking_and_no_save(tiny_model_dir, tmp_path):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [vowels], train_dataset=single_task_rows(),
        eval_dataset=single_task_rows(3),
        args=common.args(tmp_path, max_steps=4, num_generations=3, prompts_per_step=2,
                         num_generations_eval=3, eval_steps=1, eval_on_start=False,
                         save_strategy="best", metric_for_best_model="loss",
                         load_best_model_at_end=True, save_total_limit=1))
    evaluated = []
    trainer.add_callback(type("C", (TrainerCallback,), {
        "on_evaluate": lambda self, a, s, c, metrics=None, **k: evaluated.append(
            metrics["eval_loss"])}))
    trainer.train()
    best = min(range(len(evaluated)), key=evaluated.__getitem__) + 1
    assert trainer.state.best_metric == pytest.approx(evaluated[best - 1])
    assert trainer.state.best_model_checkpoint == str(tmp_path / f"checkpoint-{best}")
    assert Path(trainer.state.best_model_checkpoint).is_dir()  # kept by the rotation
    nothing = _trainer(tiny_model_dir, tmp_path / "none", max_steps=2, save_strategy="no")
    nothing.train()
    assert not list((tmp_path / "none").glob("checkpoint-*"))


def test_reward_hooks_trainer_state_log_extra_and_log_metric(tiny_model_dir, tmp_path):
    seen_steps = []

    def hooked(prompts, completions, trainer_state, log_extra, log_metric, **kwargs):
        seen_steps.append(trainer_state.global_step)
        log_extra("first_letter", [c[:1] for c in completions])
        log_metric("custom_accuracy", 0.25)
        return [float(len(c)) for c in completions]

    trainer = _trainer(tiny_model_dir, tmp_path, rewards=[hooked], log_completions=True)
    trainer.train()
    assert seen_steps == [0, 1, 2]
    assert trainer.state is not None
    assert len(trainer._logs["extra"]["first_letter"]) == 6  # the last step's completions
    records = [json.loads(line) for line in
               (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert all("first_letter" in r and r["first_letter"] == r["completion"][:1] for r in records)
    assert all(h["custom_accuracy"] == 0.25 for h in trainer.state.log_history)
    assert read_metrics(tmp_path, split="train")[-1]["custom_accuracy"] == 0.25
    trainer.log({"my_value": 1.5})
    assert trainer.state.log_history[-1]["my_value"] == 1.5


def test_generation_options_use_transformers_generate(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=1, min_p=0.05,
                       repetition_penalty=1.2, generation_kwargs={"no_repeat_ngram_size": 2})
    assert type(trainer.backend).__name__ == "HFGenerateBackend"
    assert trainer.backend.generation_options == {
        "min_p": 0.05, "repetition_penalty": 1.2, "no_repeat_ngram_size": 2}
    trainer.train()
    with pytest.raises(ValueError, match="use generation_backend='hf'"):
        _trainer(tiny_model_dir, tmp_path / "s", min_p=0.1, generation_backend="static")


def test_model_options(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=1, disable_dropout=True,
                       cast_lm_head_to_fp32=True, optim="sgd", lr_scheduler_type="cosine",
                       lr_scheduler_kwargs={"num_cycles": 1.0}, use_cpu=True,
                       gradient_checkpointing=True,
                       gradient_checkpointing_kwargs={"use_reentrant": False})
    assert all(m.p == 0.0 for m in trainer.unwrapped.modules() if isinstance(m, torch.nn.Dropout))
    assert trainer.unwrapped.lm_head.weight.dtype == torch.float32
    assert type(trainer.optimizer.optimizer).__name__ == "SGD"
    assert trainer.unwrapped.is_gradient_checkpointing
    trainer.train()
    # cosine with one full cycle over the run returns to the peak learning rate at the end
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(trainer.args.learning_rate)


def test_the_logged_learning_rate_is_the_one_the_step_used(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=3, learning_rate=0.01,
                       lr_scheduler_type="linear")
    trainer.train()
    total = trainer.state.max_steps  # optimizer steps (TRL's count)
    per_step = total // 3
    logged = [r["learning_rate"] for r in read_metrics(tmp_path, split="train")]
    # transformers' linear schedule: optimizer step i uses 0.01 * (total - i) / total; the last
    # optimizer step of training step k is i = k * per_step - 1
    expected = [0.01 * (total - (k * per_step - 1)) / total for k in (1, 2, 3)]
    assert logged == pytest.approx(expected, rel=1e-6)
    assert logged[0] > logged[-1] > 0.0  # the last step's rate is not the finished schedule's 0


@pytest.mark.parametrize("disable", [True, False])
def test_disable_dropout_reaches_the_lora_adapters(disable, tiny_model_dir, tmp_path):
    from peft import LoraConfig

    trainer = GRPOTrainer(str(tiny_model_dir), [vowels],
                          args=common.args(tmp_path, max_steps=1, num_generations=3,
                                           prompts_per_step=2, disable_dropout=disable),
                          train_dataset=single_task_rows(),
                          peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.2))
    rates = [m.p for name, m in trainer.unwrapped.named_modules()
             if isinstance(m, torch.nn.Dropout) and "lora_dropout" in name]
    assert rates  # the adapters carry dropout modules
    assert set(rates) == ({0.0} if disable else {0.2})  # TRL disables them after get_peft_model


def test_sync_ref_model_mixes_the_reference_towards_the_policy(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=2, beta=0.1, sync_ref_model=True,
                       ref_model_mixup_alpha=0.25, ref_model_sync_steps=2)
    name = "model.embed_tokens.weight"
    before = dict(trainer.ref_model.named_parameters())[name].detach().clone()
    trainer.train()
    policy = dict(trainer.unwrapped.named_parameters())[name].detach()
    after = dict(trainer.ref_model.named_parameters())[name].detach()
    torch.testing.assert_close(after, 0.75 * before + 0.25 * policy)
    assert not torch.equal(after, before)


def test_named_eval_sets_and_evaluate_with_a_dataset(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, num_generations_eval=2)
    metrics = trainer.evaluate(eval_dataset={"a": single_task_rows(2), "b": single_task_rows(3)})
    for name in ("a", "b"):
        assert math.isfinite(metrics[f"eval_{name}_loss"])
        assert f"eval_{name}_tasks/default/accuracy" in metrics
    single = trainer.evaluate(eval_dataset=single_task_rows(2))
    assert "eval_loss" in single
    assert trainer.state.log_history[-1]["eval_loss"] == single["eval_loss"]


def test_trl_arguments_without_a_counterpart_are_refused(tiny_model_dir, tmp_path):
    for argument, match in (("quantization_config", "load the model quantized yourself"),):
        with pytest.raises(ValueError, match=f"{argument} is not supported by mtgrpo: .*{match}"):
            GRPOTrainer(str(tiny_model_dir), [vowels], args=common.args(tmp_path),
                        train_dataset=single_task_rows(), **{argument: [print]})


def _hub_http():
    """The HTTP client library the installed huggingface_hub speaks: httpx2 from hub 2.x (the
    lock), httpx before (the hub that transformers' oldest admitted release resolves to)."""
    try:
        import httpx2
    except ModuleNotFoundError:
        import httpx as httpx2
    return httpx2


class _FakeHub:
    """The Hub's HTTP API at the network edge (huggingface_hub's client factory)."""

    def __init__(self) -> None:
        self.commits: list[dict] = []
        self.created: list[dict] = []

    def __call__(self, request):
        httpx2 = _hub_http()

        path = request.url.path
        if path == "/api/repos/create":
            body = json.loads(request.content)
            self.created.append(body)
            return httpx2.Response(200, json={"url": f"https://huggingface.co/me/{body['name']}"})
        if "/preupload/" in path:
            files = json.loads(request.content)["files"]
            return httpx2.Response(200, json={"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                for f in files]})
        if "/commit/" in path:
            lines = [json.loads(line) for line in request.content.decode().splitlines()]
            header = next(line["value"] for line in lines if line["key"] == "header")
            files = sorted(line["value"]["path"] for line in lines if line["key"] == "file")
            self.commits.append({"path": path, "message": header["summary"], "files": files})
            return httpx2.Response(200, json={
                "commitUrl": "https://huggingface.co/me/x/commit/" + "b" * 40,
                "commitOid": "b" * 40})
        return httpx2.Response(404, json={"error": f"not part of the fake hub: {path}"})


@pytest.fixture
def fake_hub(monkeypatch):
    import huggingface_hub

    httpx2 = _hub_http()
    import huggingface_hub.constants as constants
    from huggingface_hub.utils._http import default_client_factory

    hub = _FakeHub()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub)))
    yield hub
    huggingface_hub.set_client_factory(default_client_factory)


def test_push_to_hub_uploads_the_model_at_every_save_and_the_end(tiny_model_dir, tmp_path,
                                                                 fake_hub):
    trainer = _trainer(tiny_model_dir, tmp_path, max_steps=2, save_steps=1, push_to_hub=True,
                       hub_model_id="me/tiny-grpo", hub_strategy="checkpoint",
                       hub_private_repo=True, hub_token="hf_test")
    trainer.train()
    assert fake_hub.created[0]["name"] == "tiny-grpo"
    assert fake_hub.created[0]["organization"] == "me"
    assert fake_hub.created[0].get("private") or fake_hub.created[0].get("visibility") == \
        "private"
    messages = [c["message"] for c in fake_hub.commits]
    assert messages == ["Training in progress, step 1", "Checkpoint at step 1",
                        "Training in progress, step 2", "Checkpoint at step 2",
                        "End of training"]
    final = fake_hub.commits[-1]["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(final)
    checkpoint = fake_hub.commits[1]["files"]
    assert "last-checkpoint/trainable.safetensors" in checkpoint
    assert "last-checkpoint/optimizer.pt" in checkpoint


def _eval_batch() -> PolicyBatch:
    """Two completions of one prompt, 3 and 2 tokens long, advantages 1 and -2: at ratio 1 the
    clipped surrogate is -A per token, so the token-mean ("dapo") loss is
    (3 * -1 + 2 * 2) / 5 = 0.2."""
    return PolicyBatch(
        prompt_ids=torch.tensor([[5, 6, 7], [5, 6, 7]]), prompt_mask=torch.ones(2, 3),
        completion_ids=torch.tensor([[8, 9, 10], [11, 12, 0]]),
        completion_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
        advantages=torch.tensor([1.0, -2.0]))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "sapo"])
def test_evaluation_loss_runs_no_forward_where_its_value_needs_no_logps(
        tiny_model_dir, tmp_path, monkeypatch, loss_type):
    import mtgrpo.trainer.update as update_module

    updater = _trainer(tiny_model_dir, tmp_path, loss_type=loss_type).updater
    forwards, scored = [], updater._logps
    monkeypatch.setattr(updater, "_logps",
                        lambda *a, **k: forwards.append(1) or scored(*a, **k))
    without = updater.evaluation_loss(_eval_batch())
    assert forwards == []
    if loss_type == "dapo":
        assert without == pytest.approx(0.2, rel=1e-6)
    monkeypatch.setattr(update_module, "loss_value_needs_logps", lambda *a, **k: True)
    with_forward = updater.evaluation_loss(_eval_batch())
    assert forwards
    assert with_forward == without


@pytest.mark.parametrize("overrides", [{"loss_type": "cispo"}, {"beta": 0.04}])
def test_evaluation_loss_scores_the_completions_where_its_value_needs_them(
        tiny_model_dir, tmp_path, monkeypatch, overrides):
    updater = _trainer(tiny_model_dir, tmp_path, **overrides).updater
    forwards, scored = [], updater._logps
    monkeypatch.setattr(updater, "_logps",
                        lambda *a, **k: forwards.append(1) or scored(*a, **k))
    value = updater.evaluation_loss(_eval_batch())
    if "beta" in overrides:
        # the reference and the policy scored; before any update they are the same model, so
        # the KL term is 0 and the value is the clipped surrogate's 0.2
        assert len(forwards) == 2
        assert value == pytest.approx(0.2, rel=1e-5)
    else:
        # CISPO's -w A logp: the log-probabilities of the tiny model, not a constant
        assert forwards
        assert math.isfinite(value)
        assert value != pytest.approx(0.2, rel=1e-3)


def test_evaluation_time_covers_the_loss(tiny_model_dir, tmp_path, monkeypatch):
    import time

    trainer = _trainer(tiny_model_dir, tmp_path)
    scored = trainer.updater.evaluation_loss

    def slow_loss(batch, *args):
        time.sleep(0.5)
        return scored(batch, *args)

    monkeypatch.setattr(trainer.updater, "evaluation_loss", slow_loss)
    metrics = trainer.evaluate(single_task_rows(2))
    assert metrics["eval_time/eval"] >= 0.5  # generation, scoring and the loss, not the first two


def test_the_constructor_takes_trl_positional_order():
    import inspect

    from trl import GRPOTrainer as TRLGRPOTrainer

    def positional(cls: type) -> list[str]:
        return [p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD]

    assert positional(GRPOTrainer) == positional(TRLGRPOTrainer)
