"""Generate the notebooks from the blueprint catalog so they never drift from it.

    python notebooks/_generate.py          # (re)write notebooks/*.ipynb
    python notebooks/_generate.py --check  # exit 1 if a committed notebook differs

One parameterized notebook per blueprint (first code cell tagged ``parameters`` for papermill)
plus ``playground.ipynb``, the Voila app. Notebooks are written without outputs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from playground.blueprints import Blueprint, load_catalog  # noqa: E402

METADATA = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}

APP_NOTEBOOK = "playground.ipynb"


def _md(cell_id: str, text: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_markdown_cell(text.strip())
    cell["id"] = cell_id
    return cell


def _code(cell_id: str, source: str, tags: list[str] | None = None) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source.strip())
    cell["id"] = cell_id
    if tags:
        cell["metadata"]["tags"] = tags
    return cell


def _literal(value: object) -> str:
    return repr(value)


def _notebook(cells: list[nbformat.NotebookNode]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=cells, metadata=METADATA)
    nb.nbformat, nb.nbformat_minor = 4, 5
    return nb


def app_notebook() -> nbformat.NotebookNode:
    """The Voila app: gallery → form → monitor → serve → chat. No torch in this kernel.

    In booth mode (``playground app --booth``) the App reads the visitor's verified cookie itself; a warm kernel
    (preheated by Voila) gets it with the page request that takes it (``voila_app.identity.receive_request``).
    """
    nb = _notebook(
        [
            _code(
                "imports",
                """
# Blueprint Playground: the Voila app (`playground app`). The kernel talks to jobs through the
# backend only; it never imports torch or transformers.
import os
import sys

# The chart widget (plotly) imports nbformat, whose jsonschema compiles ~40 IRI grammars at import when
# rfc3987-syntax is installed: ~1.1 s of every visitor's page load on 2 cores. Nothing here checks IRIs.
sys.modules.setdefault("rfc3987_syntax", None)

from voila_app.identity import receive_request  # noqa: E402
from widgets import App, preload  # noqa: E402

preload()  # what App() would import on first use: done before a visitor comes when this kernel is a warm one
""",
            ),
            _code(
                "request",
                """
# Booth mode keeps warm kernels that ran the cell above before anyone came: such a kernel waits here for
# the page request that takes it (with the visitor's cookie). Anywhere else this returns at once.
_ = receive_request()  # a bare call would echo its True/False at the top of the page
""",
            ),
            _code(
                "app",
                """
App(
    backend_name=os.environ.get("PLAYGROUND_BACKEND", "local"),
    blueprint_id=os.environ.get("PLAYGROUND_BLUEPRINT") or None,
)
""",
            ),
        ]
    )
    nb.metadata["title"] = "Blueprint Playground"  # the page title in Voila
    return nb


def blueprint_notebook(blueprint: Blueprint) -> nbformat.NotebookNode:
    """A papermill-parameterized notebook for one blueprint (interactive or headless)."""
    params = blueprint.defaults()
    lines = [
        "# Parameters: papermill overrides these (`playground e2e`). Secrets (HF_TOKEN) come from the",
        "# environment only, never from parameters.",
        'backend = "local"  # local | kubernetes | ray | kuberay',
    ]
    for name, value in params.items():
        spec = blueprint.parameters[name]
        lines.append(f"{name} = {_literal(value)}  # {spec.describe_allowed()}")
    lines += [
        "headless = False  # True: run the whole path with no clicks, assert, write result.json",
        'model_source = None  # None: the blueprint\'s own; a local dir; "standin"; or "config" (full size, random init)',
        'dataset_source = None  # None: the blueprint\'s own; a .jsonl/.json/.csv/.parquet file (checked first); or "standin"',
        "assert_quality = True  # headless: fail unless the blueprint's quality bar is met",
        "quality_threshold = None  # headless: replaces the bar's threshold (None: the blueprint's)",
        "quality_metric = None  # headless: the bar on another held-out metric, with quality_threshold",
        "max_new_tokens = None  # headless chat answers' length (None: the blueprint's)",
        'out_dir = "."  # where result.json goes',
    ]
    param_dict = ",\n".join(f"    {name!r}: {name}" for name in params)
    quality = blueprint.quality
    bar = f"{quality.metric} {'≥' if quality.higher_is_better else '≤'} {quality.threshold}"
    intro = f"""
# {blueprint.title}

{blueprint.description}

- **blueprint** `{blueprint.id}` · task: {blueprint.task}
- **model** `{blueprint.model.source}` · **data** `{blueprint.dataset.source}` · **method** {blueprint.method.kind}
- **quality bar** (asserted when run headless): `{bar}`

Run it interactively (widgets below), or headless with papermill:
`papermill notebooks/{blueprint.id}.ipynb out.ipynb -p headless True`.
"""
    return _notebook(
        [
            _md("intro", intro),
            _code("parameters", "\n".join(lines), tags=["parameters"]),
            _code(
                "setup",
                f"""
BLUEPRINT = {blueprint.id!r}
params = {{
{param_dict},
}}
""",
            ),
            _md("path", "## Launch → watch → evaluate → serve → chat"),
            _code(
                "run",
                """
if headless:
    from playground.headless import run_blueprint

    result = run_blueprint(
        BLUEPRINT,
        params,
        backend=backend,
        model_source=model_source,
        dataset_source=dataset_source,
        assert_quality=assert_quality,
        out_dir=out_dir,
        max_new_tokens=max_new_tokens,
        quality_threshold=quality_threshold,
        quality_metric=quality_metric,
    )
else:
    import tempfile
    from pathlib import Path

    from playground.blueprints import get_blueprint
    from playground.headless import build_standins
    from widgets import App

    model_source, dataset_source = build_standins(
        get_blueprint(BLUEPRINT), model_source, dataset_source, Path(tempfile.mkdtemp(prefix="standins-"))
    )
    app = App(
        backend_name=backend,
        blueprint_id=BLUEPRINT,
        params=params,
        model_source=model_source,
        dataset_source=dataset_source,
    )
    display(app)
""",
            ),
            _md("check", "## Check (headless runs)"),
            _code(
                "assertions",
                """
if headless:
    assert result["phase"] == "Succeeded", result["error"]
    if assert_quality:
        q = result["quality"]
        assert q["passed"], f"quality bar not met: {q['metric']} = {q['value']} (threshold {q['threshold']})"
    assert result["passed"], result["error"]
    print({k: result[k] for k in ("job_id", "phase", "quality", "chat_exact_match", "timings")})
""",
            ),
        ]
    )


def generate() -> dict[str, str]:
    """File name → notebook JSON text."""
    notebooks = {APP_NOTEBOOK: app_notebook()}
    for blueprint in load_catalog().values():
        notebooks[f"{blueprint.id}.ipynb"] = blueprint_notebook(blueprint)
    out = {}
    for name, nb in notebooks.items():
        nbformat.validate(nb)
        out[name] = nbformat.writes(nb) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed notebook differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = HERE / name
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(name)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run: python notebooks/_generate.py)", file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {len(stale)} notebook(s)" + (f": {', '.join(stale)}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
