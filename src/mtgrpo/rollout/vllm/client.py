"""The server vLLM backend: generation on ``mtgrpo vllm-serve`` (TRL's ``vllm_mode="server"``).

Needs no vLLM in the trainer's environment: it speaks the server's HTTP protocol
(:mod:`mtgrpo.rollout.vllm.server`) with the standard library. The weights travel as a
safetensors file in shared memory when the server reads the trainer's files (same machine,
probed once at connection), else in the body of the request.

Faults are errors, never a silent fallback: a server that does not answer within
``timeout`` seconds (down, killed, unreachable) is an :class:`EngineUnreachableError` naming
the address and the fix; a server whose weights version is not the one this backend pushed
last (it restarted, or another trainer pushed to it) is a :class:`StaleEngineError`.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from mtgrpo.rollout.base import (
    GenerationOutput,
    SamplingParams,
    check_num_samples,
    check_prompt_ids,
    check_weights_version,
)
from mtgrpo.rollout.hf_generate import _special_ids
from mtgrpo.rollout.vllm.errors import EngineUnreachableError, StaleEngineError, WeightPushError
from mtgrpo.rollout.vllm.weights import (
    check_weight_names,
    merged_named_weights,
    pack_weights,
    shared_memory_dir,
    write_weights_file,
)

__all__ = ["VLLMServerBackend", "server_url"]

PROTOCOL = "mtgrpo-vllm/1"
TRANSPORTS = ("auto", "file", "http")


def server_url(base_url: str | None, host: str = "0.0.0.0", port: int = 8000) -> str:
    """TRL's rule: ``base_url`` when given, else ``http://host:port`` (0.0.0.0 = this machine)."""
    if base_url:
        return base_url.rstrip("/")
    # a server bound to every interface is reached over loopback
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{host}:{port}"


class VLLMServerBackend:
    """A :class:`~mtgrpo.rollout.base.GenerationBackend` on a ``mtgrpo vllm-serve`` server.

    ``url``: the server (:func:`server_url`); ``timeout``: seconds to wait for the server to
    come up at construction, and for each request (generation included) before the run stops
    with an error. ``transport``: ``auto`` (a shared-memory file when the server can read it,
    else the request body), ``file`` or ``http``. ``push_on_start``: push the policy as
    version 0 at construction (the trainer's start).
    """

    name = "vllm"
    mode = "server"
    cheap_logprobs = True

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        *,
        url: str = "http://127.0.0.1:8000",
        # TRL 1.16's vllm_server_timeout default
        timeout: float = 240.0,
        transport: str = "auto",
        eos_token_ids: Sequence[int] | None = None,
        structured_outputs_regex: str | None = None,
        sampling_options: dict[str, Any] | None = None,
        push_on_start: bool = True,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport={transport!r} is not one of {', '.join(TRANSPORTS)}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"vllm_server_timeout={timeout!r} must be a number of seconds > 0")
        self.model = model
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.eos_token_ids, self.pad_token_id = _special_ids(model, tokenizer, eos_token_ids)
        self.regex = structured_outputs_regex
        self.sampling_options = dict(sampling_options or {})
        self.weights_version: int | None = None
        self.pushes = 0
        self.info = self._wait_until_up()
        if self.info.get("protocol") != PROTOCOL:
            raise ValueError(
                f"the server at {self.url} speaks {self.info.get('protocol')!r}, not "
                f"{PROTOCOL!r}: start it with `mtgrpo vllm-serve MODEL` (TRL's `trl vllm-serve` "
                "and `vllm serve` use another protocol)"
            )
        vocab = model.get_input_embeddings().num_embeddings
        # a larger vocabulary could sample ids the policy cannot embed
        if int(self.info["vocab_size"]) > vocab:
            raise ValueError(
                f"the server at {self.url} serves {self.info['model']} with a vocabulary of "
                f"{self.info['vocab_size']} tokens, more than the policy's {vocab}: it serves "
                "another model; start it on the policy's model"
            )
        self.transport = self._choose_transport(transport)
        if push_on_start:
            self.update_weights(model, 0)

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: bytes | None = None,
                 content_type: str = "application/json", timeout: float | None = None
                 ) -> dict[str, Any]:
        """One request; connection failures are retried until ``timeout`` has passed."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            request = urllib.request.Request(self.url + path, data=body, method=method,
                                             headers={"Content-Type": content_type})
            try:
                # never 0: a socket timeout of 0 is non-blocking mode, which fails at once
                remaining = max(deadline - time.monotonic(), 0.5)
                with urllib.request.urlopen(request, timeout=remaining) as response:
                    return json.loads(response.read() or b"{}")
            # the server answered: a refusal is not retried, unlike a connection failure
            except urllib.error.HTTPError as error:
                try:
                    message = json.loads(error.read()).get("error", "")
                except ValueError:
                    message = error.reason
                raise (WeightPushError if path.startswith("/update_weights") else RuntimeError)(
                    f"the vLLM server at {self.url} refused {method} {path} "
                    f"(HTTP {error.code}): {message}"
                ) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                reason = getattr(error, "reason", error)
                if time.monotonic() >= deadline:
                    raise EngineUnreachableError(
                        f"the vLLM server at {self.url} did not answer {method} {path} within "
                        f"{limit:.0f} s ({reason}). Is `mtgrpo vllm-serve MODEL --port ...` "
                        "running there? A server that stopped mid-run lost the pushed weights: "
                        "restart it and resume from the last checkpoint (vllm_server_timeout "
                        "sets how long to wait)"
                    ) from None
                # about one retry a second, never sleeping past the deadline
                time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))

    def _wait_until_up(self) -> dict[str, Any]:
        self._request("GET", "/health")
        return self._request("GET", "/info")

    def _choose_transport(self, transport: str) -> str:
        if transport != "auto":
            return transport
        # the file transport needs the server to share this filesystem: it must read back a token
        probe = shared_memory_dir() / f"mtgrpo-probe-{uuid.uuid4().hex}"
        token = uuid.uuid4().hex
        try:
            probe.write_text(token, encoding="utf-8")
            answer = self._request("POST", "/probe_path", json.dumps(
                {"path": str(probe), "token": token}).encode())
            return "file" if answer.get("readable") else "http"
        finally:
            probe.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the contract
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 num_samples: int = 1) -> GenerationOutput:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompts = check_prompt_ids(prompt_ids, self.model.get_input_embeddings().num_embeddings)
        group = check_num_samples(num_samples)
        stop_ids = list(dict.fromkeys(self.eos_token_ids + params.stop_token_ids))
        sampling = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
                    "top_p": params.top_p, "top_k": params.top_k, "greedy": params.greedy,
                    "seed": params.seed, "return_logprobs": params.return_logprobs,
                    "stop_token_ids": stop_ids}
        body = {"prompt_ids": prompts, "n": group, "sampling": sampling,
                "structured_outputs_regex": self.regex, "options": self.sampling_options}
        out = self._request("POST", "/generate", json.dumps(body).encode())
        held = out.get("weights_version")
        # None: nothing pushed yet, so the server holds no weights of this policy
        if self.weights_version is None or held != self.weights_version:
            raise StaleEngineError(
                f"the vLLM server at {self.url} generated with weights version {held}, but "
                f"this trainer pushed version {self.weights_version} last: the server was "
                "restarted (it starts with no pushed weights) or another trainer pushes to it. "
                "Give each trainer its own server, and resume from the last checkpoint (a "
                "resume pushes the weights again)"
            )
        return GenerationOutput(
            # rows grouped by prompt, as the server answers
            prompt_ids=[list(p) for p in prompts for _ in range(group)],
            completion_ids=out["completion_ids"], finished=out["finished"],
            logprobs=out["logprobs"], weights_version=held,
        )

    def update_weights(self, model_or_state: Any, version: int) -> None:
        """Send the policy's weights (a LoRA adapter merged) to the server as ``version``."""
        check_weights_version(version)
        if isinstance(model_or_state, torch.nn.Module):
            self.model = model_or_state
            with merged_named_weights(model_or_state) as named:
                answer = self._push(named, version)
        elif isinstance(model_or_state, dict):
            check_weight_names(self.model, model_or_state)
            answer = self._push(list(model_or_state.items()), version)
        else:
            raise TypeError(
                f"update_weights takes a model or a state dict, got {type(model_or_state).__name__}"
            )
        if answer.get("weights_version") != version:
            raise WeightPushError(
                f"the vLLM server at {self.url} answered weights version "
                f"{answer.get('weights_version')} to a push of version {version}"
            )
        self.weights_version = version
        self.pushes += 1

    def _push(self, named: list[tuple[str, torch.Tensor]], version: int) -> dict[str, Any]:
        if self.transport == "file":
            path = write_weights_file(named)
            try:
                return self._request("POST", "/update_weights", json.dumps(
                    {"path": str(path), "version": version}).encode())
            finally:
                # the server has loaded it (or failed): the file holds memory in /dev/shm
                path.unlink(missing_ok=True)
        return self._request("POST", f"/update_weights?version={version}", pack_weights(named),
                             content_type="application/octet-stream")

    def reset_prefix_cache(self) -> None:
        self._request("POST", "/reset_prefix_cache", b"{}")
