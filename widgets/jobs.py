"""JobsList: running and finished jobs; Open reattaches a monitor that replays the whole history."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable

import ipywidgets as ipw

from playground.facade import Playground
from playground.types import Job
from widgets.monitor import phase_badge
from widgets.state import attachable_jobs, error_text, scrub_paths


def age_text(created_at: float, now: float | None = None) -> str:
    seconds = max(0, int((now or time.time()) - created_at))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


LIVE_SECONDS = 5.0  # while a listed job is unfinished, the list refreshes itself this often


def row_text(job: Job, now: float | None = None) -> str:
    """One job's line: id, blueprint, phase, queue position or step, age."""
    progress = ""
    if job.queue_position:
        progress = f" · queued, position {job.queue_position}"
    elif job.progress is not None:
        progress = f" · step {job.progress.step}/{job.progress.total_steps}"
    return (
        f"<code>{html.escape(job.id)}</code> · {html.escape(job.blueprint_id)} · "
        f"{phase_badge(job.phase)}{progress} · {age_text(job.created_at, now)}"
    )


class JobsList(ipw.VBox):
    """The backend's jobs, running first; ``on_open(job)`` attaches a monitor to one.

    With ``owner`` (booth mode) only that visitor's jobs are listed and can be opened. While any listed job is
    unfinished the list refreshes itself every ``live_seconds`` (rows updated in place: no widget churn).
    """

    def __init__(
        self,
        backend: Playground,
        *,
        on_open: Callable[[Job], None] | None = None,
        limit: int = 20,
        owner: str | None = None,
        live_seconds: float = LIVE_SECONDS,
    ) -> None:
        self.backend = backend
        self.on_open = on_open
        self.owner = owner
        self.limit = limit
        self.jobs: list[Job] = []
        self._row_ids: list[str] = []  # the jobs the rows show, in order
        self._last_click = float("-inf")
        self._refreshing = threading.Lock()  # the kernel thread and a monitor's thread both refresh
        self.refresh_button = ipw.Button(description="Refresh", icon="refresh")
        self.refresh_button.add_class("pg-refresh")
        self.refresh_button.on_click(lambda _: self.refresh_clicked())
        self.rows = ipw.VBox([])
        self.status = ipw.HTML("")
        super().__init__([self.refresh_button, self.rows, self.status])
        self.add_class("pg-jobs")
        self.refresh()
        self._live = threading.Event()  # set: stop refreshing by itself
        threading.Thread(target=self._keep_live, args=(live_seconds,), name="jobs-live", daemon=True).start()

    def _keep_live(self, interval: float) -> None:
        while not self._live.wait(interval):
            if any(not job.done for job in self.jobs):
                self.refresh()

    def close(self) -> None:
        self._live.set()
        super().close()

    def refresh_clicked(self) -> None:
        """Refresh, at most once a second however fast clicks arrive (any client can send them)."""
        now = time.monotonic()
        if now - self._last_click < 1.0:
            return
        self._last_click = now
        self.refresh()

    def set_backend(self, backend: Playground) -> None:
        self.backend = backend
        self.refresh()

    def refresh(self) -> list[Job]:
        with self._refreshing:
            return self._refresh()

    def _refresh(self) -> list[Job]:
        try:
            self.jobs = attachable_jobs(self.backend.list(owner=self.owner))[: self.limit]
            self.status.value = "" if self.jobs else "no jobs yet"
        except Exception as exc:
            self.jobs = []
            message = error_text(exc) if self.owner is None else scrub_paths(error_text(exc))
            self.status.value = f"<span class='pg-error-text'>{html.escape(message)}</span>"
        if [job.id for job in self.jobs] == self._row_ids:  # the same jobs: their rows' text only
            for row, job in zip(self.rows.children, self.jobs, strict=True):
                text = row_text(job)
                if row.children[1].value != text:
                    row.children[1].value = text
            return self.jobs
        for old in self.rows.children:  # free the previous rows' widgets (a long booth day)
            for widget in old.children:
                widget.close()
            old.close()
        rows = []
        for job in self.jobs:
            label = ipw.HTML(row_text(job))
            button = ipw.Button(description="Open", icon="eye", layout=ipw.Layout(width="90px"))
            button.add_class("pg-open").add_class(f"pg-open-{job.id}")
            button.on_click(lambda _, j=job: self.attach_job(j))
            rows.append(ipw.HBox([button, label]))
        self.rows.children = rows
        self._row_ids = [job.id for job in self.jobs]
        return self.jobs

    def attach_job(self, job: Job | str) -> None:
        if isinstance(job, str):
            job = self.backend.get(job, owner=self.owner)
        if self.on_open:
            self.on_open(job)
