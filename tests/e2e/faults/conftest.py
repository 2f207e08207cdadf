"""The fault matrix's fixtures (`tests.support.fault_gateway`) for every test in this folder,
the `after_each_row` check after each."""

from tests.support.fault_gateway import after_each_row, gw, http, plain_gw, upstream  # noqa: F401 - fixtures
