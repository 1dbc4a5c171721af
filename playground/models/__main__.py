"""``python -m playground.models prepare SOURCE...``: the same as ``playground models prepare``."""

import sys

from playground.cli import main

if __name__ == "__main__":
    sys.exit(main(["models", *sys.argv[1:]]))
