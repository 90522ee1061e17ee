"""Tests that need code from outside mrtr: the official conformance suite, foreign clients, dialect seeds."""
