"""``guarded check`` on the Redis factory: the contracts pass under a scratch key prefix, which is
dropped afterwards; an unreachable server exits 3 naming it without its password."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from guarded.backends.redis.redis_factory import ConfigurationError, config_from_env
from guarded.testing.redis import RedisServer, free_port

FACTORY = "guarded.backends.redis.redis_factory:create_store"


def check(url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GUARDED_REDIS_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "guarded", "check", FACTORY],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_guarded_check_passes_and_leaves_no_key(redis_server: RedisServer) -> None:
    import redis

    client = redis.Redis.from_url(redis_server.url)
    before = set(client.scan_iter(match="guarded_check_*"))
    result = check(redis_server.url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every offered contract passed" in result.stdout
    assert set(client.scan_iter(match="guarded_check_*")) == before
    client.close()


def test_guarded_check_of_an_unreachable_server_exits_3_without_the_password() -> None:
    result = check(f"redis://user:s3cret@127.0.0.1:{free_port()}/0")
    assert result.returncode == 3
    assert "s3cret" not in result.stdout + result.stderr
    assert "GUARDED_REDIS_URL" in result.stderr


def test_a_ttl_of_none_or_zero_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="GUARDED_REDIS_MEMORY_TTL"):
        config_from_env({"GUARDED_REDIS_MEMORY_TTL": "none"})
    config = config_from_env({"GUARDED_REDIS_PAUSE_TTL": "10m", "GUARDED_REDIS_REPLICAS_TO_ACK": "1"})
    assert config.options == {"pause_ttl": 600.0, "replicas_to_ack": 1}
