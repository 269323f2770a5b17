"""Moved to :mod:`delayq_backends.scripts.library`, the one place that loads scripts; kept so
``from delayq_backends.functions import install_functions`` goes on working."""

from __future__ import annotations

from .scripts.library import NodeFunctions, functions_status, install_functions

__all__ = ["NodeFunctions", "functions_status", "install_functions"]
