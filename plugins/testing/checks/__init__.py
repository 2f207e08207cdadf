"""The battery's checks, registered in the order they run (see `plugins.testing.registry`)."""

from plugins.testing.checks import (  # noqa: F401 - importing registers
    lifecycle,
    event_grammar,
    usage,
    limits,
    cancellation,
    capabilities,
    errors,
    concurrency,
    embeddings,
    close,
)
