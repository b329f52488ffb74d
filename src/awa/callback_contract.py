"""``awa.callback_contract``, the reference package's module name for signed callback URLs:
the module ``awa.callbacks.contract`` under its public name."""

import sys

from awa.callbacks import contract as _contract
from awa.callbacks.contract import *  # noqa: F403
from awa.callbacks.contract import __all__ as __all__

sys.modules[__name__] = _contract  # one module under both names
