"""Deprecated: moved to `mrtr.tasks.client` (the tasks package, split by role). Kept importable."""

import warnings

from mrtr.tasks.client import *  # noqa: F403
from mrtr.tasks.client import __all__  # noqa: F401

warnings.warn("mrtr.task_client moved to mrtr.tasks.client", DeprecationWarning, stacklevel=2)
