"""The local model server process: ``transformers serve`` pinned to one model directory.

Run by :class:`playground.serving.local.LocalServers` as
``python -m playground.serving.server MODEL_DIR --port N``. The OpenAI protocol (chat completions
streaming and not, completions, health) is transformers' own FastAPI app, built the way
``transformers serve MODEL_DIR`` builds it. Three thin additions in front of it make it a
well-behaved endpoint for one pinned model:

* ``GET /v1/models`` lists the pinned model (transformers lists the hub cache instead, and
  answers 500 when there is none, e.g. offline on a fresh machine);
* request guards: body size limit (413), JSON and field validation (400 with the reason, where
  transformers answers a bare 500), prompt longer than the model's context window (400), and
  ``max_tokens`` defaulted/clamped to the room left in the context window;
* unexpected errors answer JSON with the message instead of a bare ``Internal Server Error``;
* ``--usage-file PATH``: its modification time is the time of the last chat or completion request
  (touched when one arrives and when it ends), so the booth's cleanup knows how long a server has been idle;
* ``--batch-tokens N``: concurrent requests are answered together (transformers' continuous batching, a paged
  KV cache of N tokens) instead of one after another: the booth's shared base server. Its sampling is shared by
  every request, so it answers greedily only: a request asking for ``temperature`` > 0, ``stop`` or a
  ``generation_config`` is refused with 400 naming the field, and its other generation routes (``/v1/responses``
  and the like) answer 404.

This module imports torch/transformers: only the server process loads it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import sys
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from playground.errors import shown

log = logging.getLogger("playground.serving.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB
DEFAULT_MAX_NEW_TOKENS = 1024  # transformers serve's own default when neither request nor model names one
# Continuous batching: the KV cache in pages of this many tokens, and at most this many tokens in one forward pass
# (its logits, vocabulary-wide, are the memory peak: 256 keeps SmolLM2's at ~50 MB; measured in benchmarks/).
BATCH_PAGE_TOKENS = 64
BATCH_STEP_TOKENS = 256

_Float = Annotated[float, Field(strict=True)]


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_Part] | None = None


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    stream: StrictBool | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[_Float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[_Float, Field(gt=0, le=1)] | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None


class _ChatRequest(_Sampling):
    messages: Annotated[list[_Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None


class _CompletionRequest(_Sampling):
    prompt: str


class _Reject(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


_TYPE_TAGS = {"str", "int", "float", "bool", "none"}


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    # drop pydantic's union-member tags ("str", "list[_Part]") from the field path
    parts = [str(p) for p in err["loc"] if not (isinstance(p, str) and (p in _TYPE_TAGS or "[" in p))]
    loc = ".".join(parts)
    return (f"{loc}: {err['msg']}" if loc else err["msg"]), (loc or None)


class RequestGuard:
    """ASGI middleware in front of transformers' app (see the module docstring)."""

    GUARDED = {"/v1/chat/completions": _ChatRequest, "/v1/completions": _CompletionRequest}

    def __init__(
        self,
        app,
        *,
        model_name: str,
        tokenizer,
        context_len: int | None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        default_max_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        usage_file: str | None = None,
        batching: bool = False,
    ) -> None:
        self.app = app
        self.usage_file = usage_file
        self.batching = batching
        self.default_max_tokens = default_max_tokens
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.context_len = context_len
        self.max_body_bytes = max_body_bytes
        self.created = int(time.time())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        if path == "/v1/models" and scope["method"] == "GET":
            await self._send_json(send, 200, self._models())
            return
        schema = self.GUARDED.get(path)
        if schema is None and self.batching and scope["method"] == "POST":  # its other routes would batch unguarded
            served = " and ".join(self.GUARDED)
            await self._send_json(send, 404, error_body(f"{path}: a batching server answers {served} only", 404))
            return
        if schema is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        self._used()
        try:
            await self._guarded(schema, scope, receive, send)
        finally:
            self._used()  # a long generation counts as use until its end

    def _used(self) -> None:
        """Mark now as the time of the last request (the usage file's modification time)."""
        if self.usage_file:
            try:
                os.utime(self.usage_file)
            except FileNotFoundError:
                with contextlib.suppress(OSError):
                    open(self.usage_file, "a").close()  # created empty
            except OSError:
                pass

    async def _guarded(self, schema: type[BaseModel], scope, receive, send) -> None:
        try:
            body = await self._read_body(scope, receive)
            payload = await self._check(schema, body)
        except _Reject as exc:
            await self._send_json(send, exc.status, error_body(exc.message, exc.status, exc.param))
            return
        data = json.dumps(payload).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        scope = {**scope, "headers": headers}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _models(self) -> dict[str, Any]:
        entry = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "playground"}
        if self.context_len:
            entry["max_model_len"] = self.context_len
        return {"object": "list", "data": [entry]}

    async def _read_body(self, scope, receive) -> bytes:
        limit = self.max_body_bytes
        for key, value in scope["headers"]:
            if key.lower() == b"content-length" and value.isdigit() and int(value) > limit:
                raise _Reject(413, f"request body is {int(value)} bytes; this server accepts at most {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Reject(400, "client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Reject(413, f"request body is larger than {limit} bytes, the most this server accepts")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _check(self, schema: type[BaseModel], raw: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _Reject(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise _Reject(400, "request body must be a JSON object")
        try:
            request = schema.model_validate(payload)
        except ValidationError as exc:
            message, param = _validation_message(exc)
            raise _Reject(400, f"invalid request: {message}", param) from None
        if request.model is not None and request.model != self.model_name:
            raise _Reject(
                404, f"model {shown(request.model)} is not served here; this server serves {self.model_name!r}", "model"
            )
        n_prompt = await asyncio.to_thread(self._prompt_tokens, request)
        ctx = self.context_len
        room = None if ctx is None else ctx - n_prompt
        if room is not None and room < 1:
            raise _Reject(
                400,
                f"prompt is {n_prompt} tokens; this model's context window is {ctx} tokens "
                "(prompt plus at least one generated token)",
                "messages" if isinstance(request, _ChatRequest) else "prompt",
            )
        if self.batching:
            self._greedy_only(payload)
        asked = payload.pop("max_completion_tokens", None) or payload.get("max_tokens") or self.default_max_tokens
        payload["max_tokens"] = asked if room is None else min(asked, room)
        return payload

    @staticmethod
    def _greedy_only(payload: dict[str, Any]) -> None:
        """A batching server's requests share one sampling configuration (the first request's, in transformers):
        refuse what would change it, and make greedy explicit so the first request sets it."""
        why = "this server answers concurrent requests in one batch, greedily"
        if payload.get("temperature") not in (None, 0):
            raise _Reject(400, f"temperature: {why}; allowed: 0 or leave it out", "temperature")
        for name in ("stop", "generation_config"):
            if payload.get(name) is not None:
                raise _Reject(400, f"{name}: {why}; allowed: leave it out", name)
        payload["temperature"] = 0.0

    def _prompt_tokens(self, request: BaseModel) -> int:
        if isinstance(request, _CompletionRequest):
            return len(self.tokenizer(request.prompt)["input_ids"])
        messages = []
        for m in request.messages:
            content = m.content
            if isinstance(content, list):
                content = " ".join(p.text or "" for p in content if p.type in ("text", "input_text", "output_text"))
            messages.append({"role": m.role, "content": content or ""})
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # the chat template rejects the conversation (roles, order...)
            raise _Reject(400, f"chat template rejected the messages: {exc}", "messages") from None
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    @staticmethod
    async def _send_json(send, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})


def build_app(
    model: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    usage_file: str | None = None,
    batch_tokens: int = 0,
):
    """transformers' serving app pinned to ``model`` (loaded now), behind :class:`RequestGuard`; ``batch_tokens``
    > 0: continuous batching out of a KV cache of that many tokens."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.completion import CompletionHandler
    from transformers.cli.serving.model_manager import ModelManager
    from transformers.cli.serving.response import ResponseHandler
    from transformers.cli.serving.server import build_server
    from transformers.cli.serving.systemone import SystemOneHandler
    from transformers.cli.serving.transcription import TranscriptionHandler
    from transformers.cli.serving.utils import GenerationState

    # As `transformers serve FORCE_MODEL` wires it (transformers/cli/serve.py).
    manager = ModelManager(device=device, dtype=dtype, force_model=model)
    if batch_tokens > 0:
        from transformers import ContinuousBatchingConfig

        pages = max(1, math.ceil(batch_tokens / BATCH_PAGE_TOKENS))
        cache = ContinuousBatchingConfig(
            num_blocks=pages, page_size=BATCH_PAGE_TOKENS, max_batch_tokens=BATCH_STEP_TOKENS
        )
        state = GenerationState(continuous_batching=True, cb_config=cache)
    else:
        state = GenerationState()
    app = build_server(
        manager,
        ChatCompletionHandler(model_manager=manager, generation_state=state, chat_template_kwargs={}),
        completion_handler=CompletionHandler(model_manager=manager, generation_state=state),
        response_handler=ResponseHandler(model_manager=manager, generation_state=state, chat_template_kwargs={}),
        transcription_handler=TranscriptionHandler(manager, state),
        systemone_handler=SystemOneHandler(model_manager=manager, generation_state=state, chat_template_kwargs={}),
        generation_state=state,
    )

    async def _unexpected(_request: Request, exc: Exception):
        log.exception("request failed")
        return JSONResponse(error_body(f"{type(exc).__name__}: {exc}", 500), status_code=500)

    app.add_exception_handler(Exception, _unexpected)

    loaded, processor = manager.load_model_and_processor(manager.process_model_name(model))
    tokenizer = getattr(processor, "tokenizer", processor)
    context_len = getattr(loaded.config.get_text_config(), "max_position_embeddings", None)
    # Like vLLM (KServe's runtime): the model's generation_config.json max_new_tokens is the default
    # max_tokens (the trainer writes the blueprint's serving.max_new_tokens there).
    default_max = getattr(loaded.generation_config, "max_new_tokens", None) or DEFAULT_MAX_NEW_TOKENS
    return RequestGuard(
        app,
        model_name=model,
        tokenizer=tokenizer,
        context_len=context_len,
        max_body_bytes=max_body_bytes,
        default_max_tokens=default_max,
        usage_file=usage_file,
        batching=batch_tokens > 0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m playground.serving.server", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="model directory (or hub id) to pin; also the model name clients ask for")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default=os.environ.get("PLAYGROUND_SERVE_DEVICE", "auto"))
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--usage-file", default=None, help="touched at every chat/completion request (idle time)")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=0,
        help="answer concurrent requests in one batch out of a KV cache of this many tokens (0: one at a time)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("PLAYGROUND_SERVE_THREADS", "0")),
        help="torch CPU threads (default: env PLAYGROUND_SERVE_THREADS, else torch's default)",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    # Take the port before the (slow) model load, so a lost race fails in a second, not after it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: address already in use ({exc})", file=sys.stderr)
        return 3
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    log.info("loading %s", args.model)
    started = time.monotonic()
    try:
        app = build_app(
            args.model,
            device=args.device,
            dtype=args.dtype,
            max_body_bytes=args.max_body_bytes,
            usage_file=args.usage_file,
            batch_tokens=args.batch_tokens,
        )
    except Exception as exc:
        log.exception("could not load %s", args.model)
        print(f"error: could not load {args.model}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    elapsed = time.monotonic() - started
    log.info("loaded %s in %.1fs; serving on http://%s:%d/v1", args.model, elapsed, args.host, args.port)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
