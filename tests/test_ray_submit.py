"""Submitting to a Ray head whose job agent has not registered yet, over real HTTP with Ray's own client.

A freshly started Ray head answers its dashboard before its node's job agent has registered; a submission then
gets "No available agent to submit job, please try again later." (Ray waits only 10 s for the agent; a loaded
2-core machine needs longer, which failed a CI run's whole Ray module once). The head here is a small emulator
of Ray's Job API (its request and response bodies built from Ray's own ``JobSubmitRequest`` and ``JobDetails``)
that refuses the first submissions that way, as a real head does, which no real Ray here can be made to do
on demand.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from ray.dashboard.modules.job.common import JobSubmitRequest
from ray.dashboard.modules.job.pydantic_models import JobDetails

from playground.api import make_request
from playground.backends.ray.backend import RayBackend
from playground.errors import BackendError
from playground.types import JobPhase

AGENT_NOT_READY = "No available agent to submit job, please try again later."


class RayHeadEmulator:
    """Ray's Job API: ``/api/version``, ``POST /api/jobs/``, ``GET /api/jobs/<id>`` and its logs; the first
    ``refusals`` submissions are answered 500 with ``refusal`` (Ray's words for a missing job agent)."""

    def __init__(self, refusals: int, refusal: str = AGENT_NOT_READY) -> None:
        import ray

        self.refusals, self.refusal, self.ray_version = refusals, refusal, ray.__version__
        self.submissions: list[dict[str, Any]] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.rstrip("/")
                if path == "/api/version":
                    return self._send(200, {"version": "4", "ray_version": head.ray_version, "ray_commit": "x"})
                parts = path.split("/")  # "", "api", "jobs", <id>[, "logs"]
                job = head.jobs.get(parts[3]) if len(parts) > 3 else None
                if job is None:
                    return self._send(404, f"Job {parts[-1]} does not exist")
                return self._send(200, {"logs": ""} if parts[-1] == "logs" else job)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                head.submissions.append(body)
                if len(head.submissions) <= head.refusals:
                    return self._send(500, head.refusal)
                request = JobSubmitRequest(**body)  # Ray's own schema: an unknown field is a TypeError here
                details = JobDetails(
                    type="SUBMISSION", submission_id=request.submission_id, status="PENDING",
                    entrypoint=request.entrypoint, metadata=request.metadata, runtime_env=request.runtime_env,
                    message="Job has not started yet.",
                )  # fmt: skip
                head.jobs[request.submission_id] = json.loads(details.json())
                return self._send(200, {"job_id": None, "submission_id": request.submission_id})

        return Handler


@pytest.fixture
def head(request: pytest.FixtureRequest) -> Iterator[RayHeadEmulator]:
    emulator = RayHeadEmulator(*request.param)
    yield emulator
    emulator.close()


def backend_for(head: RayHeadEmulator, tmp_path: Path, agent_wait: float = 30.0) -> RayBackend:
    return RayBackend(tmp_path, address=head.url, storage=str(tmp_path / "storage"), agent_wait=agent_wait)


@pytest.mark.parametrize("head", [(3,)], indirect=True)
def test_a_submission_waits_for_the_heads_job_agent(head: RayHeadEmulator, tmp_path: Path) -> None:
    """Refused three times for want of an agent, the same submission (same id) goes in on the fourth."""
    job = backend_for(head, tmp_path).submit(make_request("tiny-llama-cpu", {"max_steps": 2}))
    assert len(head.submissions) == 4
    assert {body["submission_id"] for body in head.submissions} == {job.id}
    assert job.phase == JobPhase.PENDING and job.blueprint_id == "tiny-llama-cpu"


@pytest.mark.parametrize("head", [(1, "runtime_env setup failed: bad pip spec")], indirect=True)
def test_any_other_refusal_is_reported_at_once(head: RayHeadEmulator, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"Ray refused job tiny-llama-cpu-.*: RuntimeError: .*bad pip spec"):
        backend_for(head, tmp_path).submit(make_request("tiny-llama-cpu", {"max_steps": 2}))
    assert len(head.submissions) == 1


@pytest.mark.parametrize("head", [(10_000,)], indirect=True)
def test_a_job_agent_that_never_comes_is_a_clear_error(head: RayHeadEmulator, tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"its job agent did not come up within 2s.*No available agent"):
        backend_for(head, tmp_path, agent_wait=2.0).submit(make_request("tiny-llama-cpu", {"max_steps": 2}))
    assert 2 <= len(head.submissions) <= 4
    assert not (tmp_path / "storage").exists() or not any((tmp_path / "storage").iterdir())
