"""`toolkit`: parse arguments, call the SDK, render results. Nothing else lives here.

toolkit/cli/common.py holds the typer app, its global options and what every verb shares; each module imported below
registers its verbs on the app when imported, in the order --help lists them. Like common.py, each imports only the SDK
(toolkit.sdk), the error map (toolkit.errors) and the config (toolkit.config): tests/toolkit/test_layers.py.
"""

from __future__ import annotations

from toolkit.cli.common import app

# imported for what importing them does: each registers its verbs on `app`, in the order --help lists them
# isort: off
from toolkit.cli import config_cmds, train_cmds, infra_cmds, serve_cmds, eval_cmds  # noqa: F401
# isort: on

__all__ = ["app", "main"]


def main() -> None:
    app()
