"""Reading a visitor's kubectl request: mistyped task words spelt right, a typed ``-n`` said in words, names
untouched."""

from __future__ import annotations

import pytest

from playground.kubectl.request import VOCABULARY, normalize


@pytest.mark.parametrize(
    ("typed", "read"),
    [
        ("sclae the web deployment to 3", "scale the web deployment to 3"),  # two letters swapped
        ("list deploymnets", "list deployments"),
        ("statefulsts in data ns?", "statefulsets in data ns?"),  # a letter missing
        ("descibe job nightly-backup in batch", "describe job nightly-backup in batch"),
        ("drainn node gpu-7", "drain node gpu-7"),  # a letter doubled
        ("show servcies in prod", "show services in prod"),
        ("udpate search deployment image to search:3.1.0", "update search deployment image to search:3.1.0"),
        ("Sclae web to 3", "scale web to 3"),
        ("restrat auth, its stuck", "restart auth, its stuck"),  # before a comma
        ("configmaps -n dev", "configmaps in the dev namespace"),  # a namespace typed as a flag
        ("restart nginx deployment plz --namespace=web", "restart nginx deployment plz in the web namespace"),
        ("list deploymnets -n qa", "list deployments in the qa namespace"),
    ],
)
def test_mistyped_task_words_are_spelt_right(typed: str, read: str) -> None:
    assert normalize(typed) == read


@pytest.mark.parametrize(
    "request_text",
    [
        "scale web to 3 replicas",  # nothing to read otherwise
        "who scaled web to 3?",  # a word of the vocabulary with an ending is a word of its own
        "cordoned nodes?",
        "roll out the deploy",  # the start of one ("deploy" of "deployment")
        "delete pod sclae-7d9f8-x2k4q",  # a name that looks like a typo stays as typed
        "apply k8s/deploymnet.yaml",  # ... and a file
        "set image deployment/api api=api:relase",
        "what is the capital of France?",
        "show the logs of pod web-1 -n",  # a flag without its value
        "describe node gpu-7 --namespaced",
    ],
)
def test_names_and_words_of_their_own_are_left_as_typed(request_text: str) -> None:
    assert normalize(request_text) == request_text


def test_a_word_near_two_task_words_is_left_as_typed() -> None:
    """A reading is made only where one task word is a single edit away: with two, either would be a guess."""
    assert {"secret", "secrets", "label", "labels"} <= VOCABULARY
    assert normalize("show secrest in prod") == "show secrest in prod"  # "secret" + s, or "secrets" swapped
    assert normalize("lable web") == "label web"  # "labels" is two edits away
