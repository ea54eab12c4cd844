"""toolkit: fine-tune gpt-oss (or any causal LM) with LoRA on SageMaker and serve it with vLLM.

The public API (`toolkit.load_config`, `toolkit.train`, ...) is imported lazily so that importing the
package, and `toolkit --help`, stay instant.
"""

from __future__ import annotations

import sys
from importlib import import_module
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Config": "toolkit.config",
    "ConfigError": "toolkit.config",
    "load_config": "toolkit.config",
    "check": "toolkit.sdk",
    "prepare_data": "toolkit.sdk",
    "train": "toolkit.sdk",
    "job": "toolkit.sdk",
    "job_status": "toolkit.sdk",
    "list_jobs": "toolkit.sdk",
    "list_endpoints": "toolkit.sdk",
    "plan": "toolkit.sdk",
    "render_train": "toolkit.sdk",
    "build_image": "toolkit.sdk",
    "deploy": "toolkit.sdk",
    "render_deploy": "toolkit.sdk",
    "endpoints": "toolkit.sdk",
    "serve_local": "toolkit.sdk",
    "serve_local_until_stopped": "toolkit.sdk",
    "render_serve_local": "toolkit.sdk",
    "chat_client": "toolkit.sdk",
    "register": "toolkit.sdk",
    "infra_plan": "toolkit.sdk",
    "infra_apply": "toolkit.sdk",
    "infra_outputs": "toolkit.sdk",
    "infra_destroy": "toolkit.sdk",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")


class _Package(ModuleType):
    """`toolkit.deploy` and `toolkit.plan` name SDK functions and also a sub-package and a module below: Python sets a
    sub-module on its package when it is first imported, which hid the function (the README's `toolkit.deploy(...)`
    raised TypeError). The SDK's names win; the sub-modules stay importable by their full names."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _EXPORTS and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
