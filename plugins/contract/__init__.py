"""The contract every room above builds on: the request and its events (`protocol`), the one
error hierarchy (`errors`), the hook specifications (`hookspecs`) and the configuration's
plugin-facing types (`config_types`: backend types, routes and their targets)."""
