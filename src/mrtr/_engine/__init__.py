"""The engine: one round of a flow against its journal (private; see `mrtr`)."""
