# Voila configuration for `playground app --booth` (passed with --Voila.config_file_paths).
# The visitor cookie hook and the capped kernel manager; the numbers come from the command line.
from voila_app.server import configure

configure(get_config())  # noqa: F821 - provided by traitlets when it loads this file
