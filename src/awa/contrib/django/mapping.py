"""How Django tasks map onto awa jobs: one job kind, and priorities.

A Django task runs as an awa job of kind ``django_task``. Its priority (-100 to 100,
higher runs first, default 0) becomes an awa priority (1 to 4, 1 runs first, default 2).

awa has one level above its default and two below, so the mapping keeps Django's default
on awa's and splits only the lower half:

=================  ============
Django priority    awa priority
=================  ============
1 to 100           1
0 (the default)    2
-1 to -50          3
-51 to -100        4
=================  ============

The task's own priority is kept in the job's args, so a result reports it exactly.
"""

from __future__ import annotations

KIND = "django_task"
"""The awa job kind that runs Django tasks."""


def awa_priority(django_priority: int) -> int:
    """The awa priority (1 most urgent, 4 least) a Django task priority runs at."""
    if django_priority > 0:
        return 1
    if django_priority == 0:
        return 2
    if django_priority >= -50:
        return 3
    return 4
