"""Routing strategies behind the `switchyard_route` hook: which of a route's targets serves a
request."""
