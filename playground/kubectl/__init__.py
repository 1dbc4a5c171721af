"""The kubectl task: a plain-English request → the one exact kubectl command, from training rows to the chat panel.

Modules (each imports only the stdlib and the ones before it; nothing here imports torch or transformers):

- ``core``: the core task's operations (:data:`~playground.kubectl.core.OPERATIONS`), names and phrasings.
- ``wide``: ``operations: wide``, requests as visitors type them, and :data:`~playground.kubectl.wide.REFUSAL`.
- ``reward``: :func:`~playground.kubectl.reward.score`, the verifiable reward (GRPO, the held-out mean reward).
- ``guard``: :func:`~playground.kubectl.guard.guard`, a cluster-changing answer only where the request asked for it.
- ``answer``: :func:`~playground.kubectl.answer.complete`, the namespace the request says added to a bare answer.
- ``request``: :func:`~playground.kubectl.request.normalize`, a request read as the model was taught.
- ``generator``: :func:`~playground.kubectl.generator.kubectl_sample`, one training row (the synthetic task
  ``kubectl`` of :mod:`playground.train.data`; it imports :class:`playground.train.sample.Sample`).

This package imports none of its modules itself: ``import playground.kubectl`` costs nothing.
"""
