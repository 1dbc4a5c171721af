"""An ASGI middleware vLLM's API server loads with ``--middleware`` (standard library only: it runs in vLLM's own
environment, copied there as ``playground_vllm_guard.py`` by :mod:`playground.serving.vllm_server`).

It adds the two things vLLM's server does not do for the playground:

* a request body over ``PLAYGROUND_GUARD_MAX_BODY_BYTES`` (default 1 MiB) answers **413** in the OpenAI error shape,
  read from ``Content-Length`` or counted while streaming in, before vLLM parses it (vLLM answers 400 after reading
  any size);
* every chat or completion request touches ``PLAYGROUND_GUARD_USAGE_DIR/<model>.used`` (the ``model`` it names,
  the base model or a job's adapter), so the playground knows when each was last used (idle servers, and which
  adapter is least recently used when the cap is reached).
* a chat request for a LoRA adapter is rendered with the adapter's own chat template
  (``PLAYGROUND_GUARD_TEMPLATES_DIR/<model>.jinja``, the template the job trained and evaluated with; vLLM renders
  every model of a server with the base model's), put into the request as ``chat_template`` (the server runs with
  ``--trust-request-chat-template``); a ``chat_template`` a client sends is dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Any

DEFAULT_MAX_BODY_BYTES = 1 << 20
_USED_PATHS = ("/v1/chat/completions", "/v1/completions")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def usage_file(usage_dir: str | Path, model: str) -> Path:
    """Where the last use of ``model`` (a served model name) is recorded (its modification time)."""
    return Path(usage_dir) / f"{_SAFE_NAME.sub('-', model).strip('-.') or 'model'}.used"


def template_file(templates_dir: str | Path, model: str) -> Path:
    """Where the chat template of ``model`` (a LoRA adapter's served name) is kept for the guard."""
    return Path(templates_dir) / f"{_SAFE_NAME.sub('-', model).strip('-.') or 'model'}.jinja"


class PlaygroundGuard:
    """Body size limit (413) and per-model usage files, in front of vLLM's routes."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.limit = int(os.environ.get("PLAYGROUND_GUARD_MAX_BODY_BYTES") or DEFAULT_MAX_BODY_BYTES)
        self.usage_dir = os.environ.get("PLAYGROUND_GUARD_USAGE_DIR") or None
        self.templates_dir = os.environ.get("PLAYGROUND_GUARD_TEMPLATES_DIR") or None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers") or []:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._too_large(send, f"request body is {int(value)} bytes")
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send, "request body is larger than that")
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        if self.usage_dir and scope.get("path") in _USED_PATHS:
            self._touch(body)
        if scope.get("path") == "/v1/chat/completions":
            body, scope = self._with_template(body, scope)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _touch(self, body: bytes) -> None:
        try:
            model = json.loads(body).get("model")
        except (ValueError, AttributeError):
            return
        if isinstance(model, str) and model:
            with contextlib.suppress(OSError):
                usage_file(self.usage_dir, model).touch()

    def _with_template(self, body: bytes, scope: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """The chat request with the chat template of the model it names (an adapter's), and none of the client's."""
        try:
            request = json.loads(body)
        except ValueError:
            return body, scope
        if not isinstance(request, dict):
            return body, scope
        changed = request.pop("chat_template", None) is not None
        model = request.get("model")
        if self.templates_dir and isinstance(model, str) and model:
            with contextlib.suppress(OSError):
                request["chat_template"] = template_file(self.templates_dir, model).read_text()
                changed = True
        if not changed:
            return body, scope
        body = json.dumps(request).encode()
        headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"content-length"]
        return body, {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}

    async def _too_large(self, send: Any, said: str) -> None:
        message = f"{said}; this server accepts at most {self.limit} bytes"
        payload = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 413}}
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
