"""Tests that spawn processes or need brokers: server fleets, Redis, PostgreSQL, HAProxy, Temporal."""
