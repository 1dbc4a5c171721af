"""ipywidgets views over the engine: gallery → form → monitor → serve → chat.

The widgets talk only to a :class:`~playground.backends.base.Backend` and the chat client;
they never import torch or transformers. The pure logic lives in :mod:`widgets.state`.
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
