"""The kubectl task's training rows: a plain-English request and the one exact kubectl command that does it.

The core operations and names are :mod:`playground.kubectl.core`; ``operations: wide`` adds
:mod:`playground.kubectl.wide`. A ``general_fraction`` of the training rows (default 0.2) are general questions
with the base model's own answers (general_answers.json, made by scripts/general_answers.py), so LoRA teaches the
commands without wrecking the chat. ``playground.train.data`` registers :func:`kubectl_sample` as the synthetic
task ``kubectl``.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

from playground.kubectl import core, wide
from playground.train.sample import Sample


@functools.cache
def general_answers() -> tuple[Sample, ...]:
    """General questions with SmolLM2-135M-Instruct's own (greedy, first-sentence) answers."""
    rows = json.loads(Path(__file__).with_name("general_answers.json").read_text())
    return tuple(Sample(row["prompt"], row["answer"]) for row in rows)


def kubectl_sample(rng: random.Random, options: dict[str, Any], held_out: bool = False) -> Sample:
    """A plain-English request and the one exact kubectl command that does it (training rows: or,
    for ``general_fraction`` of them, a general question with the base model's own answer).

    ``operations: wide`` (:mod:`playground.kubectl.wide`): more operations and phrasings, the namespace said
    first, a ``reason_fraction`` of training requests (default 0) with why they are asked after them ("…, it's
    stuck"), a ``typo_fraction`` of requests mistyped, and an ``unsupported_fraction`` of requests no supported
    operation answers, with the refusal as their answer (and, where they name a namespaced object, a namespace as
    often as a supported request says one)."""
    if not held_out and rng.random() < float(options.get("general_fraction", 0.2)):
        return rng.choice(general_answers())
    widened = options.get("operations", "core") == "wide"
    ops = wide.wide_ops(core.OPERATIONS) if widened else core.OPERATIONS
    command, train_phrasings, held_phrasings, namespaced = rng.choice(ops)
    unseen = held_out and rng.random() < float(options.get("held_out_phrasing", 0.5))
    app = rng.choice(core.APPS[held_out])
    values = {
        "app": app,
        "n": rng.randint(0, 12),
        "kinds": rng.choice(core.KINDS),
        "kind": rng.choice(core.KIND),
        "pod": f"{app}-{rng.randint(0, 9)}",
        "new_ns": rng.choice(core.NAMESPACES[held_out]),
        "port": rng.choice(core.PORTS),
        "tag": rng.choice(core.TAGS),
        "node": f"{rng.choice(core.NODE_POOLS[held_out])}-{rng.randint(1, 20)}",
    }
    if widened:
        values.update(
            wide.names(rng, held_out, core.APPS[held_out], core.NAMESPACES[held_out], core.NODE_POOLS[held_out])
        )
        values.update(wide.extra_values(rng, held_out, values))
    spoken = values
    refused = widened and rng.random() < float(options.get("unsupported_fraction", 0.15))
    if refused:
        request, namespaced = wide.unsupported_request(rng, unseen, values)
        answer = wide.REFUSAL
    else:
        if widened:
            spoken, values = wide.fit_values(rng, command, values)
        request = rng.choice(held_phrasings if unseen else train_phrasings).format(**spoken)
        answer = command.format(**values)
    namespace, first = "", False
    if namespaced and rng.random() < float(options.get("namespace_fraction", 0.5)):
        if widened:
            namespace = wide.namespace(rng, core.APPS[held_out], core.NAMESPACES[held_out])
        else:
            namespace = rng.choice(core.NAMESPACES[held_out])
        first = widened and rng.random() < 0.3
        if first:
            request = wide.namespace_first(rng, request, namespace, unseen)
        else:
            suffixes = core.IN_NAMESPACE[unseen] + (wide.IN_NAMESPACE[unseen] if widened else [])
            request += rng.choice(suffixes).format(ns=namespace)
        if not refused:
            answer += f" -n {namespace}"
    reason_fraction = float(options.get("reason_fraction", 0.0)) if widened and not held_out else 0.0
    if reason_fraction and rng.random() < reason_fraction:
        request = wide.with_reason(rng, request, None if refused else command, spoken)
    if not widened:
        wrappers = core.WRAPPERS
    elif first:
        wrappers = wide.WIDE_WRAPPERS  # "yo in prod: …", never "can you in prod: …"
    else:
        wrappers = rng.choice((core.WRAPPERS, wide.WIDE_WRAPPERS))
    request = rng.choice(wrappers[unseen and rng.random() < 0.5]).format(r=request)
    if widened and rng.random() < float(options.get("typo_fraction", 0.25)):
        names = {str(v).lower() for v in (*values.values(), namespace)}
        request = wide.typo(rng, request, names)
    if rng.random() < (0.4 if widened else 0.5):
        request = request[0].upper() + request[1:]
    return Sample(request, answer)
