"""`python -m bot.cli`: the same as the `ragbot` command."""
from bot.cli.main import app

app()
