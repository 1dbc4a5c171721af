"""Kubernetes API failures as one clear line (BackendError: CLI exit 2, inline in the UI)."""

from __future__ import annotations

import json
import re
from typing import Any

from playground.errors import BackendError


def _body(exc: Any) -> dict[str, Any]:
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            data = json.loads(body)
            return data if isinstance(data, dict) else {}
        except ValueError:
            return {"message": body.strip()}
    return {}


def root_cause(exc: BaseException) -> BaseException:
    """The ApiException / connection error under the SDK's RuntimeError wrappers."""
    from kubernetes.client.exceptions import ApiException

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ApiException):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _unreachable(exc: BaseException) -> str | None:
    from urllib3.exceptions import HTTPError as Urllib3Error

    text = str(exc)
    if isinstance(exc, Urllib3Error | ConnectionError | OSError) or "Max retries exceeded" in text:
        reason = re.search(r"(Connection refused|Name or service not known|timed out|No route to host)", text)
        return reason.group(1) if reason else type(exc).__name__
    return None


def api_error(
    exc: BaseException,
    *,
    verb: str,
    resource: str,
    namespace: str | None,
    name: str | None = None,
    host: str | None = None,
) -> BackendError:
    """Translate a failed API call (``verb`` on ``resource``) into a BackendError naming what to fix."""
    root = root_cause(exc)
    status = getattr(root, "status", None)
    where = f" in namespace {namespace!r}" if namespace else ""
    what = f"{resource} {name!r}" if name else resource
    if status is None or status == 0:
        reason = _unreachable(root) or _unreachable(exc)
        if reason:
            return BackendError(f"cannot reach the Kubernetes API at {host or 'the cluster'}: {reason}")
        return BackendError(f"cannot {verb} {what}{where}: {root}")
    body = _body(root)
    message = str(body.get("message") or getattr(root, "reason", "") or "").strip()
    if status == 401:
        return BackendError(
            f"the Kubernetes API at {host or 'the cluster'} rejected the credentials (401 Unauthorized); "
            "refresh the kubeconfig token or pick another --context"
        )
    if status == 403:
        user = re.search(r'User "([^"]+)"', message)
        who = f"user {user.group(1)!r}" if user else "this identity"
        return BackendError(
            f"forbidden: {who} cannot {verb} {resource}{where} (403); grant it with deploy/rbac/ (a Role with "
            f"verb {verb!r} on {resource})"
        )
    if status == 404:
        return BackendError(f"{what} not found{where} (404)")
    if status == 409:
        return BackendError(f"{what} already exists{where} (409 AlreadyExists): choose another name or delete it")
    if status == 422:
        causes = (body.get("details") or {}).get("causes") or []
        if causes:
            first = causes[0]
            field = first.get("field") or "(spec)"
            detail = first.get("message") or first.get("reason") or message
            more = f" (+{len(causes) - 1} more)" if len(causes) > 1 else ""
            return BackendError(f"invalid {what}: field {field}: {detail}{more} (422)", field=field)
        return BackendError(f"invalid {what}: {message} (422)")
    return BackendError(f"cannot {verb} {what}{where}: {status} {message}".rstrip())
