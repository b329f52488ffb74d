"""The operator web UI: ``awa ui``, or ``awa.ui.create_app(...)`` mounted in your own app.
Needs the ``ui`` extra (``pip install 'awa-py[ui]'``); without it, importing this package
raises ``awa.errors.MissingExtra`` saying so."""

from awa.core.extras import require_extra

require_extra("ui", "awa.ui", ("starlette", "jinja2", "python_multipart"))

from awa.ui.app import create_app  # noqa: E402 - only once the check has passed

__all__ = ["create_app"]
