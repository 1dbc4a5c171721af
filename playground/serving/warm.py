"""``python -m playground.serving.warm BLUEPRINT``: start the blueprint's base model server now (the one vLLM server
every visitor's base chat and LoRA adapter share), so that no visitor's first Serve waits for it. ``playground app``
runs it detached beside Voila, in the app's own environment (its home, its booth policy)."""

from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    from playground.blueprints import get_blueprint
    from playground.errors import UserError
    from playground.facade import connect
    from playground.serving.local import LocalServers

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m playground.serving.warm BLUEPRINT", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        source = get_blueprint(args[0]).model.source
        servers = connect("local").servers
        if not isinstance(servers, LocalServers):
            return 0
        endpoint = servers.base_server(source, pin=True)
    except UserError as exc:
        print(f"error: the base model server could not start: {exc}", flush=True)
        return 2
    seconds = time.monotonic() - started
    print(f"base model server ready in {seconds:.0f}s: {endpoint.url} ({endpoint.model})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
