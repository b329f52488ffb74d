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

# The command and the helpers of awa.cli.group, re-exported for programs that extend it.
from awa.cli.group import CliError as CliError
from awa.cli.group import CliState as CliState
from awa.cli.group import CliUsageError as CliUsageError
from awa.cli.group import client_from_context as client_from_context
from awa.cli.group import database_url_from_context as database_url_from_context
from awa.cli.group import json_option as json_option
from awa.cli.group import main as main
from awa.cli.group import pass_client as pass_client
from awa.cli.group import print_json as print_json
from awa.cli.group import print_table as print_table
from awa.cli.group import to_jsonable as to_jsonable
