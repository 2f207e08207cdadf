"""The command-line tests' fixtures: the scaffold's toy package (`tests.support.plugin_kit`)."""

from tests.support.plugin_kit import toy_package  # noqa: F401 - a fixture
