"""DataPanel: "Your data & model" on the launch form (not in booth mode).

A dataset file (a path, or an upload saved under ``$PLAYGROUND_HOME/uploads``), a column mapping, a
held-out file and a model source; "Check data" shows the engine's report (split, token lengths, a preview
with the trained tokens marked) or its one-line error; "Save as blueprint" writes a blueprint of your own.
Torch-free: every check is the engine's (:func:`playground.api.check_data`, :func:`~playground.api.custom_blueprint`).
"""

from __future__ import annotations

import html
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ipywidgets as ipw

from playground import api
from playground.api import FILE_SUFFIXES, Blueprint, DatasetError, ensure_writable_dir, playground_home
from playground.errors import UserError, shown
from widgets.state import error_text

# An upload larger than this is refused (its bytes are not written): below the 10 MiB websocket message limit the
# server keeps (tornado's default); a larger file is given by its path.
MAX_UPLOAD_BYTES = 9 * 1024 * 1024
MAX_TEXT = 4096  # the longest path / column mapping / id accepted from a text box
MAX_NAME = 100  # characters kept of an uploaded file's stem
PREVIEW_CHARS = 2000  # characters of each preview row shown
TITLE = "Your data & model"
DATA_FIELDS = frozenset({"dataset", "columns", "eval_source", "model", "model.chat_template", "upload", "messages"})

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _error_html(message: str) -> str:
    return f"<span class='pg-error-text'>{html.escape(message)}</span>" if message else ""


def _help_html(message: str) -> str:
    return f"<span class='pg-help'>{html.escape(message)}</span>"


def upload_dir() -> Path:
    return playground_home() / "uploads"


def safe_upload_name(name: object) -> str:
    """A file name for an upload from what a client sent: its last path component, only ``[A-Za-z0-9._-]``,
    no leading dots, a dataset suffix. The client's name never becomes a path."""
    if not isinstance(name, str) or not name.strip():
        raise UserError("upload: the file has no name; allowed: a .jsonl/.json/.csv/.parquet file", field="upload")
    base = re.split(r"[\\/]", name)[-1]
    stem, suffix = os.path.splitext(_UNSAFE.sub("_", base))
    suffix = suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise UserError(
            f"upload {shown(name)}: unsupported file type {suffix or '(none)'!r}; allowed: {', '.join(FILE_SUFFIXES)}",
            field="upload",
        )
    stem = stem.lstrip("._-")[:MAX_NAME] or "upload"
    return stem + suffix


def save_upload(name: object, content: object, *, directory: Path | None = None, limit: int | None = None) -> Path:
    """Write an uploaded file privately (0600 in a 0700 directory) as ``<directory>/<safe name>``; a one-line
    UserError for a file that is too large, has no content or an unsupported type."""
    if not isinstance(content, bytes | bytearray | memoryview):
        raise UserError("upload: no file content received; allowed: a file", field="upload")
    data = memoryview(content).cast("B")
    limit = MAX_UPLOAD_BYTES if limit is None else limit
    if data.nbytes > limit:
        raise UserError(
            f"upload: {data.nbytes / 1e6:.1f} MB; allowed: at most {limit / 1e6:.0f} MB "
            "(for a larger file, give its path on this machine)",
            field="upload",
        )
    if data.nbytes == 0:
        raise UserError("upload: the file is empty; allowed: a file with at least 2 rows", field="upload")
    filename = safe_upload_name(name)
    folder = ensure_writable_dir(directory or upload_dir(), what="upload directory")
    os.chmod(folder, 0o700)
    target = folder / filename
    if target.parent.resolve() != folder.resolve():  # cannot happen with a sanitized name; never write outside
        raise UserError("upload: not a valid file name", field="upload")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".upload-", suffix=".tmp")  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)  # replaces a link at target, never writes through it
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _preview_row(item: Mapping[str, Any]) -> str:
    parts, left = [], PREVIEW_CHARS
    for segment in item.get("segments", []):
        text = str(segment.get("text", ""))
        cut = text[:left]
        left -= len(cut)
        escaped = html.escape(cut)
        parts.append(f"<mark>{escaped}</mark>" if segment.get("trained") else escaped)
        if left <= 0:
            parts.append("…")
            break
    head = _help_html(f"row {item.get('row')}")
    return f"<div class='pg-data-row'>{head}<pre class='pg-data-preview'>{''.join(parts)}</pre></div>"


def report_html(report: Any) -> str:
    """A :class:`~playground.userdata.DatasetReport` as HTML: the split, token lengths and truncation, a
    preview with the trained tokens in ``<mark>``, notes. Every text from the file is escaped."""
    name = Path(report.source).name
    multi = f", {report.multi_turn_rows} multi-turn" if report.multi_turn_rows else ""
    lines = [
        f"<div class='pg-data-split'>✓ {html.escape(name)}: {report.rows} rows ({html.escape(report.shape)}{multi}); "
        f"{report.train_rows} to train, {report.eval_rows} held out ({html.escape(report.eval_from)})</div>"
    ]
    if report.tokens:
        t = report.tokens
        how = "" if report.tokens_exact else " (estimated: no tokenizer at hand)"
        cut = f"max_seq_length {report.max_seq_length} truncates {report.truncated} of {report.rows} rows"
        if report.dropped:
            cut += f", drops {report.dropped} (prompt alone too long)"
        css = "pg-note" if report.truncated or report.dropped else "pg-data-ok"
        lines.append(
            f"<div class='pg-data-tokens'>tokens per example{how}: p50 {t['p50']} · p90 {t['p90']} · "
            f"p99 {t['p99']} · max {t['max']}; <span class='{css}'>{cut}</span></div>"
        )
    if report.preview:
        lines.append(f"<div>preview through {html.escape(report.template)} (<mark>trained tokens</mark>):</div>")
        lines += [_preview_row(item) for item in report.preview]
    lines += [f"<div class='pg-note'>{html.escape(note)}</div>" for note in report.notes]
    return "".join(lines)


class DataPanel(ipw.Accordion):
    """The "Your data & model" section, collapsed until opened.

    ``params()`` gives the form's validated parameters (None while a value is invalid); ``on_saved(blueprint)``
    is called after "Save as blueprint" (the App refreshes its gallery). Every value is read kernel-side
    and checked: a client can send anything through a widget.
    """

    def __init__(
        self,
        blueprint: Blueprint,
        *,
        params: Callable[[], Mapping[str, Any] | None],
        model_source: str | None = None,
        dataset_source: str | None = None,
        on_saved: Callable[[Blueprint], None] | None = None,
    ) -> None:
        self.blueprint = blueprint
        self.params = params
        self.on_saved = on_saved
        self.report: Any = None
        style = {"description_width": "120px"}
        wide = ipw.Layout(width="560px")
        suffixes = ",".join(FILE_SUFFIXES)
        self.dataset = ipw.Text(
            value=dataset_source or "", description="dataset file", style=style, layout=wide,
            placeholder=f"a {'/'.join(FILE_SUFFIXES)} file here, or hf://ORG/NAME (empty: the blueprint's own)",
        )  # fmt: skip
        self.upload = ipw.FileUpload(accept=suffixes, multiple=False, description="Upload")
        self.columns = ipw.Text(
            description="columns", style=style, layout=wide,
            placeholder="NAME=COLUMN,… e.g. prompt=question,completion=answer (empty: detected)",
        )  # fmt: skip
        self.eval_file = ipw.Text(
            description="held-out file", style=style, layout=wide, placeholder="optional: rows to evaluate on"
        )
        self.model = ipw.Text(
            value=model_source or "", description="model source", style=style, layout=wide,
            placeholder="optional: hf://ORG/NAME, a directory, pkg://…, scratch://ARCH (empty: the blueprint's)",
        )  # fmt: skip
        self.check_button = ipw.Button(description="Check data", icon="search")
        self.output = ipw.HTML("").add_class("pg-data-report")
        self.save_id = ipw.Text(description="blueprint id", style=style, placeholder="my-blueprint")
        self.save_button = ipw.Button(description="Save as blueprint", icon="save")
        self.save_status = ipw.HTML("").add_class("pg-data-saved")
        for widget, css in (
            (self.dataset, "pg-data-dataset"),
            (self.upload, "pg-data-upload"),
            (self.columns, "pg-data-columns"),
            (self.eval_file, "pg-data-eval"),
            (self.model, "pg-data-model"),
            (self.check_button, "pg-data-check"),
            (self.save_button, "pg-data-save"),
        ):
            widget.add_class(css)
        self.check_button.on_click(lambda _: self.check())
        self.save_button.on_click(lambda _: self.save())
        self.upload.observe(self._on_upload, names="value")
        body = ipw.VBox(
            [
                ipw.HBox([self.dataset, self.upload]),
                self.columns,
                self.eval_file,
                self.model,
                self.check_button,
                self.output,
                ipw.HBox([self.save_id, self.save_button, self.save_status], layout=ipw.Layout(align_items="center")),
            ]
        )
        super().__init__(children=[body], titles=(TITLE,), selected_index=None)
        self.add_class("pg-data")

    # -- values (as a client may have sent them) -------------------------------------------------

    @staticmethod
    def _text(widget: ipw.Text, what: str) -> str:
        value = widget.value
        if not isinstance(value, str) or len(value) > MAX_TEXT or "\x00" in value:
            raise UserError(f"{what}: not valid; allowed: at most {MAX_TEXT} characters of text", field=what)
        return value.strip()

    def sources(self) -> tuple[str | None, str | None]:
        """(dataset source, model source), None where left empty (the blueprint's own)."""
        dataset = self._text(self.dataset, "dataset")
        model = self._text(self.model, "model")
        return dataset or None, model or None

    def extras(self) -> tuple[dict[str, str] | None, str | None]:
        """(column mapping, held-out file), None where left empty."""
        columns = self._text(self.columns, "columns")
        held_out = self._text(self.eval_file, "eval_source")
        return (api.parse_columns(columns) if columns else None), held_out or None

    def launch_sources(self) -> dict[str, str | None]:
        """What Launch passes to the engine; columns and a held-out file live in a blueprint of your own."""
        columns, held_out = self.extras()
        if columns or held_out:
            raise UserError(
                "columns and a held-out file apply to a blueprint of your own: Save as blueprint, pick it above, "
                "then launch",
                field="columns",
            )
        dataset, model = self.sources()
        return {"dataset_source": dataset, "model_source": model}

    # -- actions -----------------------------------------------------------------------------------

    def show_error(self, message: str) -> None:
        """A one-line error in the report area (the section opens to show it)."""
        self.output.value = _error_html(message)
        self.selected_index = 0

    def check(self) -> Any:
        """Check the data (and the model's architecture) as Launch would; returns the report or None."""
        self.report = None
        try:
            report, notes, source = self._check()
        except UserError as exc:
            self.show_error(error_text(exc))
            return None
        except Exception as exc:  # never a traceback or a path to the page
            self.show_error(f"could not check the data ({type(exc).__name__})")
            return None
        extra = "".join(f"<div class='pg-note'>{html.escape(n)}</div>" for n in notes)
        if report is None:
            message = f"{source}: not a local file; it is read when the job starts"
            self.output.value = _help_html(message) + extra
        else:
            self.report = report
            self.output.value = report_html(report) + extra
        return report

    def _check(self) -> tuple[Any, list[str], str]:
        params = self.params()
        if params is None:
            raise UserError("check: fix the highlighted values first", field="params")
        dataset, model = self.sources()
        columns, held_out = self.extras()
        notes: list[str] = []
        if model is not None and ("://" in model or Path(model).expanduser().is_dir()):
            notes += api.check_architecture(model, self.blueprint).notes
        report = api.check_data(
            self.blueprint, params, dataset_source=dataset, model_source=model, columns=columns, eval_source=held_out
        )
        return report, notes, dataset or self.blueprint.dataset.source

    def save(self) -> Path | None:
        """Save a blueprint of your own: this blueprint's recipe on the data and model given here."""
        try:
            blueprint_id = self._text(self.save_id, "id")
            if not blueprint_id:
                raise UserError("blueprint id: empty; allowed: a new id such as my-blueprint", field="id")
            dataset, model = self.sources()
            if dataset is None and model is None:
                raise UserError("save: give a dataset file or a model source first", field="dataset")
            columns, held_out = self.extras()
            blueprint, path, notes = api.custom_blueprint(
                blueprint_id,
                base=self.blueprint.id,
                model_source=model,
                dataset_source=dataset,
                columns=columns,
                eval_source=held_out,
            )
        except UserError as exc:
            self.save_status.value = _error_html(error_text(exc))
            return None
        except Exception as exc:
            self.save_status.value = _error_html(f"could not save the blueprint ({type(exc).__name__})")
            return None
        lines = [f"saved {blueprint.id} as {path}: pick it above"] + [f"note: {n}" for n in notes]
        if self.on_saved is not None:
            try:
                self.on_saved(blueprint)
            except Exception as exc:
                lines.append(f"the gallery was not refreshed ({type(exc).__name__}): reload the page")
        self.save_status.value = "<br>".join(_help_html(line) for line in lines)
        return path

    def _on_upload(self, change: Mapping[str, Any]) -> None:
        files = change["new"]
        if not files:
            return
        try:
            item = files[-1]
            if not isinstance(item, Mapping):
                raise UserError("upload: not a file", field="upload")
            path = save_upload(item.get("name"), item.get("content"))
        except UserError as exc:
            self.show_error(error_text(exc))
        except Exception as exc:
            self.show_error(f"could not save the upload ({type(exc).__name__})")
        else:
            self.dataset.value = str(path)
            self.check()
        finally:
            self.upload.value = ()  # the bytes leave the kernel's memory; the button is ready for the next file


def is_data_error(exc: BaseException) -> bool:
    """Whether an engine error is about the data or the model (shown in the panel too)."""
    return isinstance(exc, DatasetError) or getattr(exc, "field", None) in DATA_FIELDS
