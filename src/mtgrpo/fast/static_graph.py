"""CUDA-graph capture of the static backend's decode step (CUDA only; nothing here runs on CPU).

A decode step (:class:`mtgrpo.fast.static.StaticGenerator`'s one-token forward +
sampling + bookkeeping) reads and writes only tensors that live as long as the captured graph
(the static KV cache, the step's input/output buffers, the model's parameters) and never reads
a value on the host, so it can be recorded once per (rows, cache length, sampling rule) and
replayed with one launch per token, removing the per-kernel CPU launch cost that dominates
decoding of a small model (a 24-layer model launches several hundred small kernels per token).

This is the manual ``torch.cuda.CUDAGraph`` recipe of the PyTorch documentation ("CUDA
Graphs", whole-network capture): warm up on a side stream (lazy initialisation of cuBLAS
handles and workspaces, allocator warm-up), then capture under ``torch.cuda.graph``, which
gives the graph a private memory pool for its intermediates. We do not use
``torch.compile(mode="reduce-overhead")``: wrapped around transformers' forward it hands back
outputs living in the CUDA-graph pool that the next replay overwrites (the failure the project
measured), while here the step returns nothing and every result lands in buffers we own.

What a captured graph bakes in, and therefore what invalidates it: the addresses of every
tensor it touches (parameters re-assigned rather than updated in place, a model moved to
another device or dtype, a re-allocated cache) and every Python-level branch taken while it
was recorded (sampling options, peft adapters enabled/disabled/merged, the attention
implementation). The backend keys graphs by shape and sampling rule and drops them when the
fingerprint of parameter addresses and adapter state changes (and runs the model without
autocast, so no cast is recorded).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["CapturedStep", "capture_step"]


class CapturedStep:
    """A recorded decode step: calling it replays the graph on the current stream."""

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def __call__(self) -> None:
        self.graph.replay()


def capture_step(step: Callable[[], None], *, warmup_steps: int) -> CapturedStep:
    """Run ``step`` ``warmup_steps`` times on a side stream, then record one call of it.

    ``step`` must be a zero-argument in-place update of long-lived tensors (no return value,
    no host reads). The warm-up calls really execute and change those tensors: the caller
    snapshots and restores its state around this function. Raises whatever CUDA or PyTorch
    raises when the step is not capturable (a host synchronisation, a CPU tensor created
    inside the step, ...); the caller falls back to eager execution.
    """
    # the warm-up on a side stream, as the PyTorch "CUDA Graphs" documentation's recipe does
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup_steps):
            step()
    # the capture starts after the warm-up's writes have landed
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # "thread_local": CUDA calls that other threads of the trainer make meanwhile (a reward
    # model, a logger) do not invalidate this capture; only this thread's must be capturable.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()
    return CapturedStep(graph)
