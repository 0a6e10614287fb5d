"""What one policy update keeps in memory (``mtgrpo.trainer.update.PolicyUpdater``): the
reference and old-policy passes run without gradients (autograd saves no tensor for them, so
they store no activations), every pass scores through the chunked output head (at most
``logprob_chunk_size`` positions of ``[positions, V]`` logits at a time), and under gradient
checkpointing the training forward recomputes its layers in the backward pass."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import transformers

from mtgrpo import GRPOConfig
from mtgrpo.fast import enable_activation_checkpointing
from mtgrpo.policy import build_optimizer, build_scheduler
from mtgrpo.policy.logprobs import resolve_logprob_path
from mtgrpo.trainer.update import PolicyUpdater, pad_policy_batch

pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

VOCAB, LAYERS, CHUNK = 61, 2, 4


def tiny(lora: bool) -> torch.nn.Module:
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa"))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8,
                                                 target_modules=["q_proj", "v_proj"]))
    return model


def updater_for(model: torch.nn.Module, lora: bool, tmp_path, **options) -> PolicyUpdater:
    """A KL-penalised update with two iterations per batch (so reference and old log-probs are
    both computed), two rows per micro-batch, ``CHUNK`` positions per output-head call."""
    from accelerate import Accelerator

    from mtgrpo.models import reference_mode

    args = GRPOConfig(output_dir=str(tmp_path), beta=0.04, num_iterations=2,
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=5,
                      bf16=False, learning_rate=1e-3, **options)
    optimizer = build_optimizer(model, args.learning_rate)
    return PolicyUpdater(
        args, model, optimizer, build_scheduler(optimizer, total_steps=4),
        Accelerator(cpu=True),
        reference_model=None if lora else copy.deepcopy(model).eval().requires_grad_(False),
        reference=(lambda: reference_mode(model)) if lora else None,
        logprob_chunk_size=CHUNK, autocast=contextlib.nullcontext,
    )


def policy_batch():
    """Two groups of two rows: prompts of 3 and 4 tokens, completions of 5, 2, 4 and 3."""
    prompts = [[5, 6, 7], [5, 6, 7], [8, 9, 10, 11], [8, 9, 10, 11]]
    completions = [[12, 13, 14, 15, 16], [17, 18], [19, 20, 21, 22], [23, 24, 25]]
    return pad_policy_batch(prompts, completions, torch.tensor([1.0, -1.0, 0.5, -0.5]),
                            pad_token_id=0)


class Recorder:
    """Per pass (``score``: the no-grad scoring of the reference and old log-probs; ``train``:
    the forward/backward passes of the optimizer steps): tensors autograd saved for the
    backward pass, and the positions of each output-head call."""

    def __init__(self, updater: PolicyUpdater, heads: list[torch.nn.Module]) -> None:
        self.phase = "train"
        self.saved = {"score": 0, "train": 0}
        self.head_rows: dict[str, list[int]] = {"score": [], "train": []}
        self.handles = [head.register_forward_pre_hook(self._head_call) for head in heads]
        score = updater.score

        def recorded_score(*args, **kwargs):
            self.phase = "score"
            try:
                return score(*args, **kwargs)
            finally:
                self.phase = "train"

        updater.score = recorded_score

    def _head_call(self, module, args) -> None:
        self.head_rows[self.phase].append(args[0].shape[0])

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self.saved[self.phase] += 1
        return tensor

    @contextlib.contextmanager
    def recording(self):
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor):
            yield
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_reference_and_old_policy_passes_save_nothing_and_every_pass_is_chunked(lora, tmp_path):
    model = tiny(lora)
    updater = updater_for(model, lora, tmp_path)
    heads = [resolve_logprob_path(model).head]
    if updater.reference_model is not None:
        heads.append(resolve_logprob_path(updater.reference_model).head)
    recorder = Recorder(updater, heads)
    batch = policy_batch()
    with recorder.recording():
        out = updater.update(batch)
    assert out.optimizer_steps == 2
    assert "kl" in out.metrics
    # reference and old log-probs: no tensor kept for a backward pass, hence no activations
    assert recorder.saved["score"] == 0
    assert recorder.saved["train"] > 0
    # 14 completion tokens: the reference and old passes score them in two micro-batches of
    # 7; the head sees at most CHUNK of them per call in every pass (each training
    # micro-batch once forward, its 7 positions being under the 256 MiB kept-logits budget)
    tokens = int(batch.completion_mask.sum())
    assert sum(recorder.head_rows["score"]) == 2 * tokens
    assert sum(recorder.head_rows["train"]) == 2 * tokens  # two iterations
    assert max(recorder.head_rows["score"] + recorder.head_rows["train"]) <= CHUNK


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_update_recomputes_under_gradient_checkpointing(lora, tmp_path):
    """The update's forward passes honour ``gradient_checkpointing``: the training passes run
    each layer again in the backward pass (and the head's chunks), the no-grad passes do not;
    the update's loss and parameters equal those of the update without it."""
    results = []
    for checkpointing in (False, True):
        model = tiny(lora)
        if checkpointing:
            enable_activation_checkpointing(model, {"use_reentrant": False})
            if lora:
                model.enable_input_require_grads()
        updater = updater_for(model, lora, tmp_path)
        layer = resolve_logprob_path(model).backbone.layers[0]
        grad_modes: list[bool] = []

        def record(module, args, grad_modes=grad_modes) -> None:
            grad_modes.append(torch.is_grad_enabled())

        handle = layer.mlp.register_forward_pre_hook(record)
        out = updater.update(policy_batch())
        handle.remove()
        trained = {name: p.detach().clone() for name, p in model.named_parameters()
                   if p.requires_grad}
        results.append((out.metrics["loss"], trained, grad_modes))
    (loss, trained, plain_calls), (loss_gc, trained_gc, gc_calls) = results
    # old log-probs: one no-grad call per micro-batch (2); under LoRA the reference pass runs
    # the same layers with the adapter off (2 more); training: 2 iterations x 2 micro-batches
    no_grad_calls = 4 if lora else 2
    assert plain_calls.count(False) == gc_calls.count(False) == no_grad_calls
    assert plain_calls.count(True) == 4
    assert gc_calls.count(True) == 8  # each training forward once more, in its backward pass
    assert loss_gc == pytest.approx(loss, abs=1e-6)
    assert trained.keys() == trained_gc.keys()
    for name, value in trained.items():
        # Adam's first steps move each entry by about the learning rate whatever the gradient's
        # size, so a gradient lost to checkpointing shows as a difference of 1e-3
        torch.testing.assert_close(trained_gc[name], value, rtol=0, atol=1e-6, msg=name)
