"""``python -m awa``: the ``awa`` command (as the reference package runs its CLI).

Importing this module runs nothing: ``main(argv)`` runs the command and returns its exit
code, for programs and tests that call the CLI in-process.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the ``awa`` command with ``argv`` (default: the process's arguments) and return
    its exit code: 0 on success, 1 for an error, 2 for a bad command line. Messages go to
    stdout and stderr exactly as when the command runs on its own."""
    from awa.cli import main as command

    try:
        # Click's standalone mode prints errors and usage as the command line shows them,
        # then ends with sys.exit(code), success included: that code is the result. Usage
        # lines name "python -m awa" when run so, and "awa" when called with arguments.
        prog_name = None if argv is None else "awa"
        command.main(args=argv, prog_name=prog_name, standalone_mode=True)
    except SystemExit as exit_:
        return _exit_code(exit_.code)
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    print(code, file=sys.stderr)  # sys.exit("message"): the message, and failure
    return 1


if __name__ == "__main__":
    sys.exit(main())
