"""Interop matrix fixtures: the mrtr server, the shared scenario, and the foreign client scripts."""
