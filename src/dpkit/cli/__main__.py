"""``python -m dpkit.cli``: the ``dpkit`` command line, as the installed ``dpkit`` script runs it."""

from dpkit.cli import app

if __name__ == "__main__":  # pragma: no cover
    app()
