"""``graphexec expire --ttl``: TTLs that are not finite, sane seconds are refused (#19.13)."""

from __future__ import annotations

import pytest

from tests.cli.test_cli import Cli, start_chain, user_mistake

pytest_plugins = ["tests.cli.test_cli"]


@pytest.mark.parametrize("ttl", ["nan", "inf", "1e308", "-1"])
def test_expire_refuses_a_ttl_that_is_not_finite_sane_seconds(cli: Cli, ttl: str) -> None:
    start_chain(cli, "a")
    user_mistake(cli, "expire", "--thread", "a", "--ttl", ttl, says="ttl of thread 'a'")
    assert cli.json("expire") == {"deleted": 0}  # no TTL was stored
    assert [t["thread_id"] for t in cli.json("threads")] == ["a"]
