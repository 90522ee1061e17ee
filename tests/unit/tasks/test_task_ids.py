"""Task ids: random ones never start with a dash, so every command line takes them as they are."""

from __future__ import annotations

from mrtr.tasks._records import new_task_id


def test_a_fresh_task_id_is_url_safe_144_bits_and_never_starts_with_a_dash() -> None:
    ids = {new_task_id() for _ in range(5000)}  # one in 64 random ids would start with "-"
    assert len(ids) == 5000, "random"
    assert all(len(task_id) == 24 and not task_id.startswith("-") for task_id in ids)
    url_safe = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert all(set(task_id) <= url_safe for task_id in ids)
