"""Entry point for ``celery -A integration.cliapp worker`` in the integration suite."""

from integration.apps import cli_app

app = cli_app()
