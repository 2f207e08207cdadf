"""The conformance kit's fixtures: the scaffold's toy package and its plugin module
(`tests.support.plugin_kit`), the correct reference the defective backends are made from."""

from tests.support.plugin_kit import toy_package, toy_plugin  # noqa: F401 - fixtures
