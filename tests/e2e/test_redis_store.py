"""Two gateway replicas sharing stored responses through a real `redis-server` (Debian's,
installed by the project's setup: `python -m engines.install redis`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.redis_server import INSTALL_HINT, RedisServer, redis_installed
from tests.support.server import echo_config, free_port, running_server


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    if not redis_installed():
        pytest.skip(f"redis-server is not installed; run `{INSTALL_HINT}`")
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_replicas_share_stored_responses(redis_url: str, tmp_path: Path) -> None:
    config = f'[responses]\nstore = "redis"\nredis_url = "{redis_url}"\nttl_s = 600\n\n' + echo_config()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with running_server(config, tmp_path / "a") as a, running_server(config, tmp_path / "b") as b:
        with openai.OpenAI(base_url=a + "/v1", api_key="x", max_retries=0) as ca, \
                openai.OpenAI(base_url=b + "/v1", api_key="x", max_retries=0) as cb:
            first = ca.responses.create(model="echo-1", input="kept in redis")
            assert cb.responses.retrieve(first.id).output_text == "kept in redis"
            follow = cb.responses.create(model="echo-1", input="next", previous_response_id=first.id)
            assert follow.usage.input_tokens == 10  # <user> kept in redis <assistant> kept in redis <user> next
            cb.responses.delete(first.id)
            with pytest.raises(openai.NotFoundError):
                ca.responses.retrieve(first.id)


def test_unreachable_redis_stops_start_up(tmp_path: Path) -> None:
    config = f'[responses]\nstore = "redis"\nredis_url = "redis://127.0.0.1:{free_port()}/0"\n\n' + echo_config()
    with pytest.raises(RuntimeError, match="responses.redis_url"):
        with running_server(config, tmp_path, ready_timeout=30):
            pass
