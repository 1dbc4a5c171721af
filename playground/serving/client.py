"""One OpenAI-style client for local servers and KServe InferenceServices (httpx only, no torch).

An endpoint is an :class:`~playground.types.Endpoint` or a base URL ending in ``/v1``
(KServe: ``.../openai/v1``). Errors become a one-line :class:`UserError` carrying the
server's own message.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from playground.errors import UserError, shown_path
from playground.types import Endpoint

DEFAULT_TIMEOUT = 300.0
Messages = str | list[dict[str, Any]]


def base_url(endpoint: Endpoint | str) -> str:
    """The endpoint's OpenAI base URL; a bare ``http://host:port`` gets ``/v1``."""
    url = (endpoint.url if isinstance(endpoint, Endpoint) else str(endpoint)).strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"endpoint URL {shown_path(url)} must look like http://HOST:PORT/v1", field="url")
    if parts.path in ("", "/"):
        url += "/v1"
    return url


def _server_message(response: httpx.Response) -> str:
    """The error text in OpenAI ({"error": {"message"}}), FastAPI ({"detail"}) or plain shapes."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err
        if isinstance(err, list):  # FastAPI validation errors
            err = "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" if isinstance(e, dict) else str(e)
                for e in err
            )
        if err:
            return str(err)
    return json.dumps(body)[:500]


_pool: tuple[int, httpx.Client] | None = None
_pool_lock = threading.Lock()


def _client() -> httpx.Client:
    """The process's one HTTP client, shared by every request and thread (httpx clients are thread-safe): its
    connections are kept alive and reused, and its TLS context is built once. A client per request cost ~35 ms of
    CPU under the GIL each (the CA bundle read again), so 20 chats sent at once went out over ~0.7 s. A new one after
    a fork: a child never shares its parent's sockets."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=32)))
        return _pool[1]


class _Session:
    def __init__(self, endpoint: Endpoint | str, timeout: float) -> None:
        self.url = base_url(endpoint)
        self.timeout = httpx.Timeout(timeout, connect=10.0)

    def _raise(self, response: httpx.Response, path: str) -> None:
        if response.status_code >= 400:
            raise UserError(
                f"{self.url}{path} answered {response.status_code}: {_server_message(response)}", field="request"
            )

    def _unreachable(self, exc: httpx.HTTPError) -> UserError:
        return UserError(
            f"cannot reach {self.url} ({type(exc).__name__}: {exc}); is the server running? see `playground servers`",
            field="url",
        )

    def get(self, path: str) -> Any:
        try:
            response = _client().get(self.url + path, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        self._raise(response, path)
        return response.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = _client().post(self.url + path, json=body, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        self._raise(response, path)
        return response.json()

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Server-sent events as JSON objects, until ``[DONE]``. Opens the request now, so an
        unreachable server or a 4xx raises here rather than at the first ``next()``."""
        client = _client()
        request = client.build_request("POST", self.url + path, json=body, timeout=self.timeout)
        try:
            response = client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if response.status_code >= 400:
            response.read()
            response.close()
            self._raise(response, path)
        return self._events(response, path)

    def _events(self, response: httpx.Response, path: str) -> Iterator[dict[str, Any]]:
        try:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                event = json.loads(data)
                if "error" in event and not event.get("choices"):
                    err = event["error"]
                    message = err.get("message") if isinstance(err, dict) else err
                    raise UserError(f"{self.url}{path} failed while streaming: {message}", field="request")
                yield event
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        finally:
            response.close()  # its connection goes back to the pool (or is dropped, if not read to the end)


def list_models(endpoint: Endpoint | str, *, timeout: float = 30.0) -> list[str]:
    """The model names the server answers to (``GET /v1/models``)."""
    data = _Session(endpoint, timeout).get("/models")
    return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]


def _model(endpoint: Endpoint | str, model: str | None, session: _Session) -> str | None:
    if model:
        return model
    if isinstance(endpoint, Endpoint) and endpoint.model:
        return endpoint.model
    names = list_models(session.url)
    return names[0] if names else None


def _body(model: str | None, stream: bool, max_tokens: int | None, temperature: float | None, **extra: Any):
    body: dict[str, Any] = {**extra, "stream": stream}
    if model:
        body["model"] = model
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    return body


def _as_messages(messages: Messages) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return list(messages)


def chat(
    endpoint: Endpoint | str,
    messages: Messages,
    *,
    model: str | None = None,
    stream: bool = False,
    max_tokens: int | None = None,
    temperature: float | None = 0.0,
    timeout: float = DEFAULT_TIMEOUT,
) -> str | Iterator[str]:
    """Chat completion: the answer text, or (``stream=True``) an iterator of text chunks.

    ``messages`` is a list of ``{"role", "content"}`` dicts (a plain string is one user turn).
    ``model`` defaults to the endpoint's model (for a bare URL: the first from ``/v1/models``).
    """
    session = _Session(endpoint, timeout)
    body = _body(_model(endpoint, model, session), stream, max_tokens, temperature, messages=_as_messages(messages))
    if not stream:
        data = session.post("/chat/completions", body)
        return data["choices"][0]["message"].get("content") or ""
    return _chunks(session.stream("/chat/completions", body), "delta")


def complete(
    endpoint: Endpoint | str,
    prompt: str,
    *,
    model: str | None = None,
    stream: bool = False,
    max_tokens: int | None = None,
    temperature: float | None = 0.0,
    timeout: float = DEFAULT_TIMEOUT,
) -> str | Iterator[str]:
    """Legacy text completion of a raw ``prompt`` (no chat template)."""
    session = _Session(endpoint, timeout)
    body = _body(_model(endpoint, model, session), stream, max_tokens, temperature, prompt=prompt)
    if not stream:
        data = session.post("/completions", body)
        return data["choices"][0].get("text") or ""
    return _chunks(session.stream("/completions", body), "text")


class TextStream(Iterator[str]):
    """The text chunks of a streamed completion. Once exhausted, ``finish_reason`` and
    ``completion_tokens`` (when the server reports usage) tell why it ended and how many tokens
    the model generated: an empty text after 12 tokens means they were all special tokens."""

    def __init__(self, events: Iterator[dict[str, Any]], field: str) -> None:
        self._events = events
        self._field = field
        self._pending: list[str] = []
        self.finish_reason: str | None = None
        self.completion_tokens: int | None = None

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        while not self._pending:
            event = next(self._events)  # StopIteration ends the text stream too
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
            for choice in event.get("choices") or []:
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
                text = (choice.get("delta") or {}).get("content") if self._field == "delta" else choice.get("text")
                if text:
                    self._pending.append(text)
        return self._pending.pop(0)


def _chunks(events: Iterator[dict[str, Any]], field: str) -> TextStream:
    return TextStream(events, field)
