"""``python -m voila_app NOTEBOOK [voila options]``: Voila in booth mode (see :class:`voila_app.server.BoothVoila`)."""

from voila_app.server import main

if __name__ == "__main__":
    main()
