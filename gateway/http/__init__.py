"""The HTTP machinery every wire API's handlers share: uvicorn's protocol writing a head with
its first body piece (`head_protocol`), the server protocol that hands a fast-path request to
an exchange instead of ASGI (`exchange_protocol`), and the handlers' common pieces (`common`)."""
