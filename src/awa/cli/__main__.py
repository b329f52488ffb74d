"""``python -m awa.cli``: the ``awa`` command."""

from awa.cli import main

main()
