"""The generation server of ``mtgrpo vllm-serve``: one vLLM engine behind a small HTTP protocol.

Protocol ``mtgrpo-vllm/1`` (JSON unless said otherwise; docs/engines.md is the reference):

* ``GET /health``: ``{"status": "ok"}`` once the engine has started.
* ``GET /info``: the model, ``max_model_len``, ``vocab_size``, the ``weights_version`` held
  (``null`` until the first push), the protocol name and vLLM's version.
* ``POST /generate``: ``{"prompt_ids": [[...]], "n": G, "sampling": {max_new_tokens,
  temperature, top_p, top_k, greedy, seed, return_logprobs, stop_token_ids},
  "structured_outputs_regex": ..., "options": {...}}`` -> ``{"completion_ids", "finished",
  "logprobs", "weights_version"}``, rows grouped by prompt.
* ``POST /update_weights?version=V``: the weights as a safetensors blob in the body
  (``application/octet-stream``), or ``{"path": "/dev/shm/...safetensors", "version": V}``
  for a file the server can read (same machine). Loads them, resets the prefix cache, records
  ``V``: ``{"weights_version": V, "tensors": count}``.
* ``POST /reset_prefix_cache``: ``{"success": true}``.
* ``POST /probe_path``: ``{"path", "token"}`` -> ``{"readable": bool}``: whether the server
  reads the trainer's file with that content (the client then pushes weights as files).

One request at a time reaches the engine (a lock); errors answer with status 4xx/5xx and
``{"error": message}``. The server binds 127.0.0.1 unless told ``--host`` (anyone who reaches
the port can replace the weights).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from mtgrpo.rollout.base import SamplingParams, check_prompt_ids
from mtgrpo.rollout.vllm.engine import (
    EngineOptions,
    load_weights,
    require_vllm,
    sample,
    start_engine,
    weights_version,
)
from mtgrpo.rollout.vllm.weights import unpack_weights

logger = logging.getLogger(__name__)

PROTOCOL = "mtgrpo-vllm/1"
_SAMPLING_FIELDS = ("max_new_tokens", "temperature", "top_p", "top_k", "greedy", "seed",
                    "return_logprobs", "stop_token_ids")

__all__ = ["PROTOCOL", "GenerationServer", "serve"]


class GenerationServer:
    """The engine and the request handlers (transport-free, so they are testable alone)."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.engine = start_engine(options)
        config = self.engine.llm_engine.model_config
        self.max_model_len = int(config.max_model_len)
        self.vocab_size = int(config.get_vocab_size())
        # one request in the engine at a time: the HTTP server answers on several threads
        self.lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "model": self.options.model,
                "max_model_len": self.max_model_len, "vocab_size": self.vocab_size,
                "weights_version": weights_version(self.engine),
                "vllm": require_vllm().__version__}

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        # whoever reaches the port writes this body: checked before the engine sees it
        prompts = check_prompt_ids(body.get("prompt_ids"), self.vocab_size)
        n = body.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        raw = body.get("sampling") or {}
        unknown = sorted(set(raw) - set(_SAMPLING_FIELDS))
        if unknown:
            raise ValueError(f"unknown sampling fields {unknown}; known: {list(_SAMPLING_FIELDS)}")
        params = SamplingParams(**raw)
        # refused here with the fix, rather than by the engine with its own message
        longest = max(len(p) for p in prompts) + params.max_new_tokens
        if longest > self.max_model_len:
            raise ValueError(
                f"a prompt of {longest - params.max_new_tokens} tokens + max_new_tokens "
                f"{params.max_new_tokens} exceeds the server's max_model_len "
                f"{self.max_model_len}; restart it with a larger --max-model-len or shorten them"
            )
        with self.lock:  # the version read here is the one that generates: no push between
            version = weights_version(self.engine)
            out = sample(self.engine, prompts, params, n, params.stop_token_ids,
                         body.get("structured_outputs_regex"), body.get("options"))
        return {**out, "weights_version": version}

    def update_weights(self, named: list[tuple[str, Any]], version: int) -> dict[str, Any]:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        with self.lock:
            load_weights(self.engine, named, version)
        return {"weights_version": version, "tensors": len(named)}

    def reset_prefix_cache(self) -> dict[str, Any]:
        with self.lock:
            self.engine.reset_prefix_cache()
        return {"success": True}


def _handler(server: GenerationServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection carries many requests

        def log_message(self, format: str, *args: Any) -> None:
            # http.server writes every request to stderr; here they are debug records
            logger.debug("%s " + format, self.address_string(), *args)

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            # under keep-alive, the length is how the client finds the end of the body
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _json(self) -> dict[str, Any]:
            data = self._body()
            value = json.loads(data) if data else {}
            if not isinstance(value, dict):
                raise ValueError("the request body must be a JSON object")
            return value

        def _answer(self, work: Any) -> None:
            try:
                self._send(200, work())
            except (ValueError, TypeError, KeyError) as error:  # a bad request: the client's fault
                self._send(400, {"error": str(error)})
            except Exception as error:
                logger.exception("request failed")
                self._send(500, {"error": f"{type(error).__name__}: {error}"})

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/info":
                self._answer(server.info)
            else:
                self._send(404, {"error": f"no GET {path}; see protocol {PROTOCOL}"})

        def do_POST(self) -> None:
            url = urlparse(self.path)
            if url.path == "/generate":
                self._answer(lambda: server.generate(self._json()))
            elif url.path == "/update_weights":
                self._answer(lambda: self._update(url))
            elif url.path == "/reset_prefix_cache":
                # read even unused: under HTTP/1.1 it would be parsed as the next request
                self._body()
                self._answer(server.reset_prefix_cache)
            elif url.path == "/probe_path":
                self._answer(lambda: self._probe(self._json()))
            else:
                self._body()  # as above: the connection may carry another request
                self._send(404, {"error": f"no POST {url.path}; see protocol {PROTOCOL}"})

        def _update(self, url: Any) -> dict[str, Any]:
            if self.headers.get("Content-Type", "").startswith("application/json"):
                body = self._json()
                # the client removes the file once this request is answered
                named = unpack_weights(Path(body["path"]).read_bytes())
                return server.update_weights(named, body.get("version"))
            query = parse_qs(url.query)
            if "version" not in query:
                raise ValueError("POST /update_weights?version=V: the version is missing")
            # parse_qs maps each name to the list of its values
            return server.update_weights(unpack_weights(self._body()),
                                         int(query["version"][0]))

        def _probe(self, body: dict[str, Any]) -> dict[str, Any]:
            try:  # the token proves it is the trainer's file, not another at the same path
                readable = Path(body["path"]).read_text(encoding="utf-8") == body["token"]
            except OSError:
                readable = False
            return {"readable": readable}

    return Handler


def serve(options: EngineOptions, host: str = "127.0.0.1", port: int = 8000,
          ready: threading.Event | None = None) -> None:
    """Start the engine, then answer requests until interrupted."""
    begin = time.perf_counter()
    server = GenerationServer(options)
    httpd = ThreadingHTTPServer((host, port), _handler(server))
    httpd.daemon_threads = True  # a request in flight never holds the server at exit
    print(f"[vllm-serve] {options.model} ready on http://{host}:{httpd.server_address[1]} "
          f"after {time.perf_counter() - begin:.0f} s (protocol {PROTOCOL})", flush=True)
    if ready is not None:
        ready.set()
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: not an error
        pass
    finally:
        httpd.server_close()
