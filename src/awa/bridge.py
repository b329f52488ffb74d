"""``awa.bridge``, the reference package's module name for inserts in a caller's transaction
on asyncpg, psycopg, SQLAlchemy or Django connections: the module ``awa.producer.bridge``
under its public name."""

import sys

from awa.producer import bridge as _bridge
from awa.producer.bridge import *  # noqa: F403
from awa.producer.bridge import __all__ as __all__

sys.modules[__name__] = _bridge  # one module under both names (private helpers included)
