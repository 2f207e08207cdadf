"""The Messages API tests' server: the scripted backend's (`tests.gateway.script_server`), in
place of the echo server of tests/gateway/conftest.py, and the official `anthropic` client."""

from tests.gateway.script_server import claude, server  # noqa: F401 - fixtures
