"""The operator web UI: ``awa ui``, or ``awa.ui.create_app(...)`` mounted in your own app."""

from awa.ui.app import create_app

__all__ = ["create_app"]
