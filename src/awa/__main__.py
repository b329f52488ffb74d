"""``python -m awa``: the ``awa`` command (as the reference package runs its CLI)."""

from awa.cli import main

main()
