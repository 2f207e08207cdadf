"""OpenAI's chat completions (and legacy completions): the wire structs (`schemas`), the request's
checks and its `RequestSpec` (`translate`), events to chunks and objects (`encode`, `chunks`),
the handlers, and the streamed fast path (`streamed`, `exchange`)."""
