"""Deprecated: moved to `mrtr.tasks.runtime` (the tasks package, split by role). Kept importable."""

import warnings

from mrtr.tasks.runtime import *  # noqa: F403
from mrtr.tasks.runtime import __all__  # noqa: F401

warnings.warn("mrtr.worker moved to mrtr.tasks.runtime", DeprecationWarning, stacklevel=2)
