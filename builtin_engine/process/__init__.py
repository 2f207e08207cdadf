"""The engine's process boundary: its calls as msgspec structs (`calls`), served by one
`LLMEngine` (`service`) in this process or in an engine process of its own (`server`, started
and restarted by `supervisor`) that a gateway process reaches over ZeroMQ (`client`)."""
