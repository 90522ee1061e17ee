"""Deprecated: moved to `mrtr.tasks.seed_dialect` (the tasks package, split by role). Kept importable."""

import warnings

from mrtr.tasks.seed_dialect import *  # noqa: F403
from mrtr.tasks.seed_dialect import __all__  # noqa: F401

warnings.warn("mrtr.seed_dialect moved to mrtr.tasks.seed_dialect", DeprecationWarning, stacklevel=2)
