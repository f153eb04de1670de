"""The `ragbot` command line, one module per command group. Nothing else imports this package."""
from bot.cli.main import app

__all__ = ["app"]
