"""``python -m playground.train.warm --blueprint ID [--set K=V]``: a base model's held-out answers, ahead of time.

Before its first step the SFT recipe asks the untouched model the held-out questions (the "before" of the page's
headline) and keeps the figure in the model cache, keyed by the model and the exact questions (``base-evals/``).
The first Launch after an install pays for it: SmolLM2's 50 questions take ~20-56 s on 2 cores. ``playground app``
runs this in the background when it starts, so that no visitor's first Launch waits for it. Already known, or
nothing to keep (a model built from scratch, a local directory, a method without exact match): it says so and
exits 0 after the tokenizer and the data, without loading the model.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from playground.errors import UserError

PROG = "playground.train.warm"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--blueprint", required=True, help="catalog id or path to a blueprint YAML file")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="parameter")
    args = parser.parse_args(argv)
    from playground.train.__main__ import prepare, quiet_libraries

    with tempfile.TemporaryDirectory(prefix="playground-warm-") as output:
        try:
            spec = prepare(["--blueprint", args.blueprint, *(f"--set={s}" for s in args.sets), "--output", output])
        except UserError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        quiet_libraries()
        return warm(spec)


def warm(spec) -> int:
    """Ask ``spec``'s base model its held-out questions unless the cache knows the answer already."""
    from playground.train import evaluate
    from playground.train import recipe as sft
    from playground.train.reporting import Reporter

    blueprint = spec.blueprint
    if blueprint.method.objective != "sft" or not sft.measures_exact_match(blueprint):
        print(f"{blueprint.id}: nothing to warm (its base model's figures are not kept)", flush=True)
        return 0
    run = sft.Recipe(spec, Reporter())
    run.runtime = sft.setup_distributed(run)
    run.data = sft.setup_data(run)
    cache = sft.base_eval_cache_of(run)
    if cache is None:
        print(f"{blueprint.id}: nothing to warm (its base model may change: not kept)", flush=True)
        return 0
    if evaluate.read_cached(cache) is not None:
        print(f"{blueprint.id}: the base model's held-out figures are known already", flush=True)
        return 0
    run.model = sft.setup_model(run)
    sft.base_eval(run)  # writes the cache, and prints the figure with its time
    return 0


if __name__ == "__main__":
    sys.exit(main())
