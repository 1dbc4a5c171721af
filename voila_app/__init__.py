"""The Voila side of ``playground app``: page template, visitor identity, kernel cap (booth mode).

Only the Voila server process loads :mod:`voila_app.server` (``python -m voila_app`` runs its
``BoothVoila``); a visitor's kernel imports :mod:`voila_app.identity` alone (pure Python + tornado's
signed values) to verify who it serves. The engine (``playground``) never imports this package; its
``playground app`` command checks its booth flags with :mod:`voila_app.limits` (pure Python).
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHARE_DIR = PACKAGE_DIR / "share"  # a Jupyter data dir: voila/templates/playground/
CONFIG_DIR = PACKAGE_DIR / "config"  # voila.py: the booth hooks
TEMPLATE = "playground"
# Booth mode: the page's kernel reads where plotly's front end is served (BoothVoila's cacheable route,
# server.PLOTLY_BUNDLE_ROUTE), a URL relative to the page's base URL; `playground app --booth` sets it.
PLOTLY_BUNDLE_ENV = "PLAYGROUND_PLOTLY_BUNDLE"
PLOTLY_BUNDLE_PATH = "playground/static/plotly-widgetbundle.js"
