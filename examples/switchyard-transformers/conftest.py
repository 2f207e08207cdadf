pytest_plugins = ["switchyard.testing"]  # the conformance battery's fixtures
