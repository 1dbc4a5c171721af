"""ipywidgets views over the engine: gallery → form → monitor → serve → chat.

The widgets use the engine only through its API (:mod:`playground.api`, the facade, the typed records, events and
errors: the layer table in tests/test_architecture.py); they never import torch or transformers. The pure logic of
the views lives in :mod:`widgets.state`.
"""

from widgets.app import App, preload
from widgets.chat import ChatPanel, ServePanel
from widgets.form import LaunchForm
from widgets.gallery import BlueprintGallery
from widgets.jobs import JobsList
from widgets.monitor import JobMonitor
from widgets.state import Coalescer, FormModel, JobState

__all__ = [
    "App",
    "BlueprintGallery",
    "ChatPanel",
    "Coalescer",
    "FormModel",
    "JobMonitor",
    "JobState",
    "JobsList",
    "LaunchForm",
    "ServePanel",
    "preload",
]
