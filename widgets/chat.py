"""ServePanel (serve fine-tuned and base) and ChatPanel (both side by side, tokens streaming in)."""

from __future__ import annotations

import contextlib
import html
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as ipw

from playground.api import Blueprint, answer_is_correct, chat, finish_answer, request_reading
from playground.facade import Playground
from playground.types import Endpoint, Job
from widgets.state import error_text, scrub_paths

SIDES = ("base", "fine-tuned")
SIDE_TITLES = {"base": "Base model", "fine-tuned": "Fine-tuned"}
MAX_PROMPT_CHARS = 500  # anything longer is refused in the kernel (a client can send any text)


def answer_html(turn: Turn) -> str:
    """The answer exactly as the model gave it: whitespace made visible, an empty answer said so."""
    if turn.error:
        return f"<span class='pg-error-text'>{html.escape(turn.error)}</span>"
    cursor = "" if turn.done else "<span class='pg-cursor'>▍</span>"
    if turn.truncated:  # the server stopped at the token limit: the answer goes on past what is shown
        cursor = "<span class='pg-cut' title='the answer reached the token limit and was cut there'>… (cut)</span>"
    if turn.guarded and not turn.done and "kubectl" in turn.answer:
        return cursor  # a command is shown once the guard has seen all of it
    if turn.held_back:
        why = html.escape(f"held back: {turn.held_back}")
        return f"{html.escape(turn.answer)} <span class='pg-held-back' title='{why}'>({why})</span>"
    if turn.answer.strip() or not turn.done:
        return html.escape(turn.answer) + cursor
    if turn.answer:  # only whitespace: show it rather than hide it
        visible = turn.answer.replace(" ", "␠").replace("\n", "⏎").replace("\t", "⇥")
        return f"<span class='pg-whitespace' title='only whitespace'>{html.escape(visible)}</span>"
    if turn.tokens:
        plural = "s" if turn.tokens != 1 else ""
        why = f"{turn.tokens} token{plural} generated, all of them special tokens with no text"
        return f"<span class='pg-empty'>(empty answer: {why})</span>"
    return "<span class='pg-empty'>(empty answer)</span>"


@dataclass
class Turn:
    prompt: str
    answer: str = ""
    done: bool = False
    error: str = ""
    expected: str | None = None
    seconds: float | None = None
    tokens: int | None = None  # completion tokens the server reported
    truncated: bool = False  # the server stopped at max_tokens (finish_reason "length")
    held_back: str = ""  # why the guard replaced the model's answer (playground/kubectl/guard.py)
    guarded: bool = False  # a command is shown only once the guard has seen all of it
    reading: str = ""  # what the models are asked where it differs from the prompt (playground/kubectl/request.py)
    added_namespace: str = ""  # the namespace added to the answer from the request (playground/kubectl/answer.py)

    @property
    def correct(self) -> bool | None:
        if self.expected is None or not self.done or self.error:
            return None
        return answer_is_correct(self.answer, self.expected)


@dataclass
class Transcript:
    """One side's turns; both sides hold a turn for every question (a side not served: its turn says so)."""

    turns: list[Turn] = field(default_factory=list)


NOT_SERVED = "not served"
# inline: the two answers to a question share a grid row (same top, same height) wherever the panel is shown
_GRID = "display:grid;grid-template-columns:1fr 1fr;column-gap:12px"
_TURN_FIELDS = ("answer", "error", "seconds", "tokens", "truncated", "held_back", "added_namespace")


def _answer_cell(side: str, turn: Turn) -> str:
    mark = ""
    if turn.correct is not None:
        mark = " <span class='pg-ok'>✓</span>" if turn.correct else " <span class='pg-bad'>✗</span>"
    added = (
        f"<div class='pg-reading'>-n {html.escape(turn.added_namespace)}: the namespace from your request</div>"
        if turn.added_namespace
        else ""
    )
    return (
        f"<div class='pg-answer-{side}'><div class='pg-a' data-side='{side}' data-done='{str(turn.done).lower()}'>"
        f"{answer_html(turn)}{mark}</div>{added}</div>"
    )


def dialogue_html(transcripts: dict[str, Transcript]) -> str:
    """Every question once, with the base and the fine-tuned answer to it side by side in one row."""
    head = "".join(f"<div class='pg-title-{side}'><b>{SIDE_TITLES[side]}</b></div>" for side in SIDES)
    rows = []
    for number, turns in enumerate(zip(*(transcripts[side].turns for side in SIDES), strict=True), start=1):
        first = turns[0]
        reading = f"<div class='pg-reading'>read as: {html.escape(first.reading)}</div>" if first.reading else ""
        cells = "".join(_answer_cell(side, turn) for side, turn in zip(SIDES, turns, strict=True))
        rows.append(
            f"<div class='pg-turn' data-turn='{number}'><div class='pg-q'>{html.escape(first.prompt)}</div>{reading}"
            f"<div class='pg-pair' style='{_GRID}'>{cells}</div></div>"
        )
    body = "".join(rows) or "<div class='pg-empty'>no messages yet</div>"
    return f"<div class='pg-dialogue-head' style='{_GRID}'>{head}</div>{body}"


def exchange_record(turns: dict[str, Turn]) -> dict[str, Any]:
    """One question and both answers as plain data (kept by the engine: a reloaded page shows them again)."""
    asked = next(iter(turns.values()))  # both sides were asked the same
    answers = {side: {name: getattr(turn, name) for name in _TURN_FIELDS} for side, turn in turns.items()}
    return {"prompt": asked.prompt, "reading": asked.reading, "answers": answers}


def restored_turn(record: dict[str, Any], side: str, expected: str | None, guarded: bool) -> Turn:
    """A kept answer as a finished turn; one that was still streaming when it was kept says it was interrupted."""
    answer = record.get("answers", {}).get(side)
    turn = Turn(prompt=str(record.get("prompt", "")), expected=expected, guarded=guarded, done=True)
    turn.reading = str(record.get("reading") or "")
    if not isinstance(answer, dict):
        turn.error = NOT_SERVED
        return turn
    turn.answer, turn.error = str(answer.get("answer") or ""), str(answer.get("error") or "")
    turn.held_back, turn.added_namespace = str(answer.get("held_back") or ""), str(answer.get("added_namespace") or "")
    turn.truncated = answer.get("truncated") is True
    tokens, seconds = answer.get("tokens"), answer.get("seconds")
    turn.tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    turn.seconds = float(seconds) if isinstance(seconds, int | float) and not isinstance(seconds, bool) else None
    if seconds is None and not turn.error:  # kept before its stream ended (the page went away meanwhile)
        turn.error = "interrupted: ask again"
    return turn


class ChatPanel(ipw.VBox):
    """Ask both models the same prompt; answers stream in side by side, a row per question (≤ 10 updates/s each).

    ``history`` (exchanges kept by the engine, see :func:`exchange_record`) is shown first; ``on_change`` gets every
    exchange each time a question has both its answers (the App keeps them: a reloaded page shows the chat again).
    """

    def __init__(
        self,
        blueprint: Blueprint,
        *,
        max_rate: float = 10.0,
        operator: bool = True,
        history: list[dict[str, Any]] | None = None,
        on_change: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.blueprint = blueprint
        self.operator = operator
        self.interval = 1.0 / max_rate
        self.endpoints: dict[str, Endpoint] = {}
        self.transcripts = {side: Transcript() for side in SIDES}
        self.expected = {ex.prompt: ex.expected for ex in blueprint.examples}
        self.on_change = on_change
        # serves a side again (its adapter was unloaded to make room for others'): set by the ServePanel
        self.reserve: Callable[[str], Endpoint] | None = None
        self._threads: list[threading.Thread] = []
        self._asking = ""  # the question being answered
        self._echo = False
        self._render_lock = threading.Lock()  # both sides' threads redraw the one dialogue
        self._kept_lock = threading.Lock()
        self._kept = len(history or [])  # exchanges handed to on_change (each once, with both its answers)
        guarded = blueprint.serving.guard == "kubectl"
        for record in history or []:
            for side in SIDES:
                turn = restored_turn(record, side, self.expected.get(str(record.get("prompt", ""))), guarded)
                self.transcripts[side].turns.append(turn)
        # both sides in one widget, a grid row per question: answers of different lengths stay beside their question
        self.dialogue = ipw.HTML(dialogue_html(self.transcripts)).add_class("pg-answers").add_class("pg-dialogue")
        self.answers = dict.fromkeys(SIDES, self.dialogue)  # each side's answers (one shared widget)
        # Enter (or leaving the box) sends the question: the value syncs then (ipywidgets' replacement for the
        # deprecated on_submit). An asked question leaves the box (it is in the dialogue): a Send click, which
        # comes right after the box's own sync (clicking Send leaves the box), finds it empty and asks nothing
        # again, however fast the first answers came.
        self.prompt = ipw.Text(placeholder="Ask both models…", layout=ipw.Layout(width="60%"), continuous_update=False)
        self.prompt.add_class("pg-prompt")
        self.prompt.observe(self._submitted, names="value")
        self.send = ipw.Button(description="Send", icon="paper-plane", button_style="primary")
        self.send.add_class("pg-send")
        self.send.on_click(lambda _: self.ask(self.prompt.value))
        self.suggestions = []
        for example in blueprint.examples:
            button = ipw.Button(description=example.prompt, tooltip="ask both models", layout=ipw.Layout(width="auto"))
            button.add_class("pg-suggestion")
            button.on_click(lambda _, p=example.prompt: self.ask(p))
            self.suggestions.append(button)
        self.status = ipw.HTML("serve the models to chat").add_class("pg-chat-status")
        super().__init__(
            [
                ipw.HBox([ipw.HTML("Try:"), *self.suggestions], layout=ipw.Layout(flex_flow="row wrap")),
                ipw.HBox([self.prompt, self.send]),
                self.dialogue,
                self.status,
            ]
        )
        self.add_class("pg-chat")
        self._set_enabled(False)

    def _set_enabled(self, enabled: bool) -> None:
        for widget in (self.send, self.prompt, *self.suggestions):
            widget.disabled = not enabled

    def set_endpoints(self, endpoints: dict[str, Endpoint]) -> None:
        self.endpoints = dict(endpoints)
        self._set_enabled(bool(self.endpoints))
        if not self.endpoints:
            self.status.value = "serve the models to chat"
        elif self.operator:
            names = ", ".join(f"{SIDE_TITLES.get(k, k)}: {e.url}" for k, e in self.endpoints.items())
            self.status.value = f"ready · {html.escape(names)}"
        else:
            self.status.value = "ready: ask both models"

    @property
    def busy(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _submitted(self, change: dict[str, Any]) -> None:
        """The prompt box's value came from the browser (Enter, or leaving the box): ask it."""
        if not self._echo:
            self.ask(change["new"])

    def ask(self, prompt: str) -> list[threading.Thread]:
        """Send ``prompt`` to every served side; returns the streaming threads.

        One question at a time, of bounded length (checked here: any client can send a click or a text).
        """
        if not isinstance(prompt, str) or not self.endpoints:
            return []
        prompt = prompt.strip()
        if not prompt:
            return []
        if len(prompt) > MAX_PROMPT_CHARS:
            self.status.value = (
                f"<span class='pg-error-text'>the question is {len(prompt)} characters; "
                f"allowed: up to {MAX_PROMPT_CHARS}</span>"
            )
            return []
        if self.busy:
            if prompt != self._asking:  # the question in flight, sent again (Enter, then Send): nothing to say
                self.status.value = "<span class='pg-error-text'>wait for both answers before asking again</span>"
            return []
        self.set_endpoints(self.endpoints)  # clears an earlier message
        self._asking = prompt
        self._echo = True  # this value is ours, not a question typed
        try:
            self.prompt.value = ""
        finally:
            self._echo = False
        reading = request_reading(self.blueprint, prompt)
        threads = []
        turns = {}
        for side in SIDES:  # every side gets a turn (one not served says so): the rows stay aligned by question
            endpoint = self.endpoints.get(side)
            turn = Turn(
                prompt=prompt,
                expected=self.expected.get(prompt),
                guarded=self.blueprint.serving.guard == "kubectl",
                reading=reading,
            )
            if endpoint is None:
                turn.done, turn.error = True, NOT_SERVED
            turns[side] = turn
            self.transcripts[side].turns.append(turn)
        for side, turn in turns.items():
            if not turn.done:
                thread = threading.Thread(target=self._stream, args=(side, self.endpoints[side], turn), daemon=True)
                thread.start()
                threads.append(thread)
        self._threads = threads
        return threads

    def exchanges(self) -> list[dict[str, Any]]:
        """Every question asked here and both answers, as plain data (oldest first)."""
        rows = zip(*(self.transcripts[side].turns for side in SIDES), strict=True)
        return [exchange_record(dict(zip(SIDES, turns, strict=True))) for turns in rows]

    def _answered(self) -> None:
        """A stream ended: once the question has both its answers, hand the chat to ``on_change`` (never raises)."""
        with self._kept_lock:
            complete = all(t.turns and t.turns[-1].done for t in self.transcripts.values())
            asked = len(self.transcripts[SIDES[0]].turns)
            if self.on_change is None or not complete or asked <= self._kept:
                return
            self._kept = asked
            with contextlib.suppress(Exception):  # keeping the chat is best effort: the answers are on the page
                self.on_change(self.exchanges())

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _refresh(self, side: str = "") -> None:
        """Redraw the dialogue (``side``: whose answer changed; both are drawn)."""
        with self._render_lock:
            self.dialogue.value = dialogue_html(self.transcripts)

    def _open_stream(self, side: str, endpoint: Endpoint, turn: Turn) -> Any:
        """The answer's token stream; an adapter unloaded meanwhile (least recently used, at the cap) is served again
        once (well under a second) and asked again."""
        from playground.errors import UserError

        def ask(target: Endpoint) -> Any:
            return chat(
                target,
                [{"role": "user", "content": turn.reading or turn.prompt}],
                stream=True,
                max_tokens=self.blueprint.serving.max_new_tokens,
                temperature=self.blueprint.serving.temperature,
            )

        try:
            return ask(endpoint)
        except UserError as exc:
            if self.reserve is None or "does not exist" not in str(exc):
                raise
        self.endpoints[side] = endpoint = self.reserve(side)
        return ask(endpoint)

    def _stream(self, side: str, endpoint: Endpoint, turn: Turn) -> None:
        start = time.monotonic()
        last = 0.0
        self._refresh(side)
        try:
            stream = self._open_stream(side, endpoint, turn)
            for chunk in stream:
                turn.answer += chunk
                now = time.monotonic()
                if now - last >= self.interval:
                    last = now
                    self._refresh(side)
            turn.tokens = getattr(stream, "completion_tokens", None)
            turn.truncated = getattr(stream, "finish_reason", None) == "length"
            finished = finish_answer(self.blueprint, turn.prompt, turn.answer, truncated=turn.truncated)
            turn.answer, turn.added_namespace = finished.answer, finished.added_namespace
            turn.held_back, turn.truncated = finished.held_back, finished.truncated
        except Exception as exc:  # shown in the column, never printed from this thread
            turn.error = error_text(exc) if self.operator else scrub_paths(error_text(exc))
        turn.seconds = time.monotonic() - start
        turn.done = True
        self._refresh(side)
        self._answered()


SHARED_KEEPS_RUNNING = "the shared base model server keeps running for other visitors"


def stopped_text(endpoints: dict[str, Endpoint]) -> str:
    """What Stop servers did: the job's own servers stopped; a shared base server (booth) is not this visitor's to
    stop, and the page says it keeps running."""
    shared = [side for side, endpoint in endpoints.items() if endpoint.shared]
    if not shared:
        return "servers stopped"
    own = [SIDE_TITLES.get(side, side) for side in sorted(endpoints) if side not in shared]
    stopped = f"{' and '.join(own)} server stopped; " if own else ""
    return f"{stopped}{SHARED_KEEPS_RUNNING}"


class ServePanel(ipw.VBox):
    """Serve a finished job's fine-tuned and base models, then hand the endpoints to a ChatPanel."""

    def __init__(
        self,
        backend: Playground,
        job: Job,
        *,
        chat: ChatPanel | None = None,
        on_ready: Callable[[dict[str, Endpoint]], None] | None = None,
        owner: str | None = None,
        operator: bool = True,
    ) -> None:
        self.backend = backend
        self.job = job
        self.owner = owner
        self.operator = operator
        self.chat = chat
        self.on_ready = on_ready
        if chat is not None:
            chat.reserve = lambda side: self.backend.serve(self.job.id, base=side == "base", owner=self.owner)
        self.endpoints: dict[str, Endpoint] = {}
        self.error = ""
        self._thread: threading.Thread | None = None
        self.serve_button = ipw.Button(description="Serve fine-tuned + base", icon="play", button_style="success")
        self.serve_button.layout.width = "auto"
        self.serve_button.add_class("pg-serve")
        self.serve_button.on_click(lambda _: self.serve())
        self.stop_button = ipw.Button(description="Stop servers", icon="stop", disabled=True)
        self.stop_button.add_class("pg-unserve")
        self.stop_button.on_click(lambda _: self.stop())
        self.status = ipw.HTML("").add_class("pg-serve-status")
        super().__init__([ipw.HBox([self.serve_button, self.stop_button]), self.status])
        self.add_class("pg-serve-panel")
        self._adopt_running()

    def _adopt_running(self) -> None:
        """After a reload, reuse servers already running for this job."""
        try:
            running = [e for e in self.backend.endpoints(owner=self.owner) if e.job_id == self.job.id]
        except Exception:
            return
        found = {e.kind: e for e in running if e.kind in SIDES}
        if "fine-tuned" in found:
            self._ready(found)

    def serve(self) -> threading.Thread | None:
        """Start both servers on background threads (they take a while to load); once at a time."""
        if (self._thread is not None and self._thread.is_alive()) or self.endpoints:
            return None  # a second click (any client can click a disabled button) starts nothing
        self.serve_button.disabled = True
        self.status.value = "starting the model servers… (loading the models)"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self._thread

    def wait(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _serve(self) -> None:
        results: dict[str, Endpoint] = {}
        errors: list[str] = []

        def one(side: str) -> None:
            try:
                results[side] = self.backend.serve(self.job.id, base=side == "base", owner=self.owner)
            except Exception as exc:
                message = error_text(exc) if self.operator else scrub_paths(error_text(exc))
                errors.append(f"{SIDE_TITLES[side]}: {message}")

        threads = [threading.Thread(target=one, args=(side,), daemon=True) for side in ("fine-tuned", "base")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.error = "; ".join(errors)
            self.status.value = f"<span class='pg-error-text'>{html.escape(self.error)}</span>"
        if results:
            self._ready(results)
        else:
            self.serve_button.disabled = False

    def _ready(self, endpoints: dict[str, Endpoint]) -> None:
        self.endpoints = dict(endpoints)
        self.serve_button.disabled = True
        self.stop_button.disabled = False
        if self.operator:
            rows = " · ".join(
                f"{SIDE_TITLES.get(k, k)}: <code>{html.escape(e.url)}</code> ({html.escape(e.model)})"
                for k, e in sorted(self.endpoints.items())
            )
        else:
            rows = " and ".join(SIDE_TITLES.get(k, k) for k in sorted(self.endpoints))
        extra = f" <span class='pg-error-text'>{html.escape(self.error)}</span>" if self.error else ""
        self.status.value = f"serving · {rows}{extra}"
        if self.chat is not None:
            self.chat.set_endpoints(self.endpoints)
        if self.on_ready:
            self.on_ready(self.endpoints)

    def stop(self) -> None:
        self.stop_button.disabled = True
        try:
            self.backend.unserve(self.job.id, owner=self.owner)
            self.status.value = stopped_text(self.endpoints)
        except Exception as exc:
            message = error_text(exc) if self.operator else scrub_paths(error_text(exc))
            self.status.value = f"<span class='pg-error-text'>{html.escape(message)}</span>"
        self.endpoints = {}
        if self.chat is not None:
            self.chat.set_endpoints({})
        self.serve_button.disabled = False
