"""Model sources that need preparing before training: a model file shipped inside an installed
Python package (``pkg://DIST/FILE``), converted once into a cached Hugging Face directory.

Light to import (no torch): the UI kernel and the local backend check sources with it.
"""
