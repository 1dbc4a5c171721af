"""The tree's rules that no other test would catch breaking: which layer imports which, and deprecations that
announce breakage of the private APIs the project leans on fail the suite instead of hiding in a filter."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _imports(folder: Path) -> list[tuple[str, str]]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [(str(path.relative_to(REPO)), n) for n in names]
    return found


def test_backends_do_not_import_serving():
    """Training backends only train: nothing under playground/backends imports playground.serving (the facade pairs
    them), so a new backend brings no serving code and no import cycle appears."""
    offenders = [
        f"{p}: {n}" for p, n in _imports(REPO / "playground" / "backends") if n.startswith("playground.serving")
    ]
    assert offenders == []


def test_the_engine_imports_no_jupyter_and_never_the_widgets():
    banned = ("widgets", "ipywidgets", "ipykernel", "IPython", "voila", "plotly", "anywidget")
    offenders = [f"{p}: {n}" for p, n in _imports(REPO / "playground") if n.split(".")[0] in banned]
    assert offenders == []


@pytest.mark.parametrize(
    "message",
    [
        "FigureWidget._widget_data is deprecated",
        "ServerKernelManager._kernel_connections will be removed",
        "transformers.cli.serving is deprecated; use transformers.serve",
        "kubernetes.watch.watch.iter_resp_lines is deprecated",
    ],
)
def test_deprecations_of_the_private_apis_in_use_fail_the_suite(message):
    with pytest.raises(DeprecationWarning, match=r"deprecated|removed"):
        warnings.warn(message, DeprecationWarning, stacklevel=1)


def test_deprecations_raised_from_the_project_fail_and_others_show():
    namespace = {"__name__": "playground.some_module", "warnings": warnings}
    with pytest.raises(DeprecationWarning):
        exec("warnings.warn('old call', DeprecationWarning)", namespace)
    with pytest.warns(DeprecationWarning):  # a dependency's own deprecation is shown, not an error
        exec("warnings.warn('old call', DeprecationWarning)", {"__name__": "somelib.module", "warnings": warnings})
