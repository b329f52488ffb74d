"""The producer path: I/O-free insert builders (``insert``), jobs with ``depends_on``
(``dependencies``), single inserts grouped when they crowd (``lanes``), bulk inserts with COPY
(``copy``), ``$1`` placeholders (``placeholders``), inserts in a caller's transaction on any
driver (``bridge``) and partitioned queues (``partitioned``). Imports observability, storage
and the core."""
