"""A small Kubeflow Hub (Model Registry) REST API over real HTTP, for the registration tests.

Built from the API's OpenAPI spec as the ``model-registry`` package ships it: its generated
``mr_openapi`` models (one per schema of the spec) validate every request body (unknown fields and
bad values are a 400, as the server's validation makes them) and every response the emulator sends
back. It keeps registered models, model versions and model artifacts in memory, under the paths the
client's generated API module names (``/api/model_registry/v1/...``), and records each request.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mr_openapi import models

PREFIX = "/api/model_registry/v1"


def _aliases(model: type) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def _checked(model: type, body: dict[str, Any]) -> Any:
    """``body`` validated against the spec's schema ``model`` (ValueError when it does not fit)."""
    unknown = set(body) - _aliases(model)
    if unknown:
        raise ValueError(f"{model.__name__}: unknown properties {sorted(unknown)}")
    return model.from_dict(body)


class HubEmulator:
    """Start with ``with HubEmulator() as hub:``; ``hub.url`` is its base URL."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body)
        self.headers: list[dict[str, str]] = []
        self.registered_models: dict[str, dict[str, Any]] = {}
        self.model_versions: dict[str, dict[str, Any]] = {}
        self.artifacts: dict[str, list[dict[str, Any]]] = {}  # model version id -> artifacts
        self._ids = 0
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubEmulator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _new(self, body: dict[str, Any]) -> dict[str, Any]:
        self._ids += 1
        now = str(int(time.time() * 1000))
        return {**body, "id": str(self._ids), "createTimeSinceEpoch": now, "lastUpdateTimeSinceEpoch": now}

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((method, path, body))
            return self._route(method, path.removeprefix(PREFIX), query, body)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        if method == "GET" and path == "/registered_models":
            items = list(self.registered_models.values())
            size = int(query.get("pageSize", len(items) or 1))
            page = {"items": items[:size], "size": len(items[:size]), "pageSize": size, "nextPageToken": ""}
            return 200, _checked(models.RegisteredModelList, page).to_dict()
        if method == "GET" and path == "/registered_model":
            found = [m for m in self.registered_models.values() if m["name"] == query.get("name")]
            return (200, found[0]) if found else _not_found("registered model")
        if method == "POST" and path == "/registered_models":
            _checked(models.RegisteredModelCreate, body)
            if any(m["name"] == body["name"] for m in self.registered_models.values()):
                return 409, {"code": "409", "message": "registered model name already exists"}
            created = self._new(body)
            self.registered_models[created["id"]] = _checked(models.RegisteredModel, created).to_dict()
            return 201, self.registered_models[created["id"]]
        if method == "GET" and path == "/model_version":
            found = [
                v
                for v in self.model_versions.values()
                if v["name"] == query.get("name") and v["registeredModelId"] == query.get("parentResourceId")
            ]
            return (200, found[0]) if found else _not_found("model version")
        if method == "POST" and path == "/model_versions":
            _checked(models.ModelVersionCreate, body)
            if body["registeredModelId"] not in self.registered_models:
                return _not_found("registered model")
            created = self._new(body)
            self.model_versions[created["id"]] = _checked(models.ModelVersion, created).to_dict()
            return 201, self.model_versions[created["id"]]
        match = re.fullmatch(r"/model_versions/([0-9]+)/artifacts", path)
        if match and method == "POST":
            version_id = match[1]
            if version_id not in self.model_versions:
                return _not_found("model version")
            artifact = models.Artifact.from_dict(body)  # oneOf: the artifactType picks the schema
            _checked(type(artifact.actual_instance), body)
            created = self._new(body)
            self.artifacts.setdefault(version_id, []).append(models.Artifact.from_dict(created).to_dict())
            return 200, self.artifacts[version_id][-1]
        return _not_found(f"route {method} {path}")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                emulator.headers.append(dict(self.headers))
                try:
                    body = json.loads(self.rfile.read(length)) if length else None
                    status, payload = emulator.handle(method, parts.path, query, body)
                except (ValueError, TypeError, KeyError) as exc:
                    status, payload = 400, {"code": "400", "message": str(exc)[:300]}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _not_found(what: str) -> tuple[int, dict[str, str]]:
    return 404, {"code": "404", "message": f"{what} not found"}
