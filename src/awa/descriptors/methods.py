"""Declaring descriptors for the worker to store (``AsyncClient`` only; reading the stored
ones: the operations of ``awa.descriptors.operations``, methods of both clients)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from awa.descriptors.operations import Descriptor, DescriptorCatalog
from awa.errors import AwaError
from awa.model import check_name


class DescriptorDeclarations:
    """Mixin of AsyncClient: declaring descriptors before ``start()`` (the worker stores
    them: declarations are the asyncio client's only)."""

    _descriptors: DescriptorCatalog

    def _declare(self, method: str) -> None:
        if getattr(self, "_runtime", None) is not None:
            raise AwaError(f"{method}() must be called before start()")

    def queue_descriptor(
        self,
        queue: str,
        *,
        display_name: str | None = None,
        description: str | None = None,
        owner: str | None = None,
        docs_url: str | None = None,
        tags: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Describe ``queue`` for operators (UI, CLI, ``awa.admin``): a display name (200
        characters), a description (2000), an owner (200), an http(s) ``docs_url`` (2048),
        up to 20 tags and ``extra`` (a JSON object, 64 KiB). Stored when the worker starts,
        which must run the queue or have a task on it; declaring it again replaces it.
        Call before ``start()`` (after: AwaError)."""
        self._declare("queue_descriptor")
        check_name("queue", queue)
        self._descriptors.queues[queue] = Descriptor.of(
            display_name=display_name,
            description=description,
            owner=owner,
            docs_url=docs_url,
            tags=tags,
            extra=extra,
        )

    def job_kind_descriptor(
        self,
        kind: str,
        *,
        display_name: str | None = None,
        description: str | None = None,
        owner: str | None = None,
        docs_url: str | None = None,
        tags: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Describe job kind ``kind`` (the string a task publishes: by default the
        snake_cased args class name); the fields and rules of ``queue_descriptor``."""
        self._declare("job_kind_descriptor")
        check_name("kind", kind)
        self._descriptors.kinds[kind] = Descriptor.of(
            display_name=display_name,
            description=description,
            owner=owner,
            docs_url=docs_url,
            tags=tags,
            extra=extra,
        )
