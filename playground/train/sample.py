"""One training example: a chat ``prompt`` and its expected ``answer``, after earlier turns. Stdlib-only: the
task generators (:mod:`playground.kubectl.generator`) make them without importing the data pipeline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """The user ``prompt`` and the expected assistant ``answer``, after the conversation's earlier turns
    (``context``: (role, content) pairs, an optional system message first). Every assistant turn is trained."""

    prompt: str
    answer: str
    context: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> tuple:
        """What makes two prompts the same (the held-out split never shares one with training)."""
        return (self.context, self.prompt) if self.context else self.prompt

    def prompt_messages(self) -> list[dict[str, str]]:
        return [*({"role": r, "content": c} for r, c in self.context), {"role": "user", "content": self.prompt}]

    def messages(self) -> list[dict[str, str]]:
        return [*self.prompt_messages(), {"role": "assistant", "content": self.answer}]
