"""The embeddings tests' server: the scripted backend's (`tests.gateway.script_server`), in place
of the echo server of tests/gateway/conftest.py, and the official `openai` client."""

from tests.gateway.script_server import oai, server  # noqa: F401 - fixtures
