"""Blueprint Playground engine: catalog, training entrypoint, backends, serving, e2e runner.

This package never imports Jupyter or ipywidgets; heavy ML libraries (torch, transformers)
are imported only inside the training entrypoint and the model server processes.
"""

__version__ = "0.1.0"
