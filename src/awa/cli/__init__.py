"""The ``awa`` operator command.

``awa.cli.group`` holds the click group ``main`` and the helpers command modules share; each
command group lives in a module of its own (``jobs``, ``queues``, ``db``, ``callbacks``,
``periodic``, ``dlq``, ``health``, ``worker``, ``workflows``, ``ui``, ``bench``, ``demo``) that
imports only ``awa.cli.group``.
Importing this package assembles them: ``awa.cli.main`` is the whole command.
"""

from awa.cli import (  # noqa: F401 - each module adds its commands to ``main``
    bench,
    callbacks,
    db,
    demo,
    dlq,
    health,
    jobs,
    periodic,
    queues,
    ui,
    worker,
    workflows,
)
from awa.cli.group import (
    CliError,
    CliState,
    CliUsageError,
    client_from_context,
    database_url_from_context,
    json_option,
    main,
    pass_client,
    print_json,
    print_table,
    to_jsonable,
)

__all__ = [
    "CliError",
    "CliState",
    "CliUsageError",
    "client_from_context",
    "database_url_from_context",
    "json_option",
    "main",
    "pass_client",
    "print_json",
    "print_table",
    "to_jsonable",
]
