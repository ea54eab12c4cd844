"""Which endpoint a config deploys to: its own model (serving.weights: merged), or an adapter inference component
on a base component that every fine-tune of the base shares (serving.weights: adapter). Above both kinds, so that
neither imports the other's module back."""

from __future__ import annotations

from toolkit.config import Config
from toolkit.deploy.adapters import AdapterEndpoints
from toolkit.deploy.endpoint import Endpoints


def for_config(config: Config) -> Endpoints:
    """The config's endpoint handle: deploy, describe, list, delete."""
    if config.serving.weights == "adapter":
        return AdapterEndpoints(config)
    return Endpoints(config)
