"""Helpers shared by the test suite: fixtures kits, spawners and the server scripts the fleet tests start."""
