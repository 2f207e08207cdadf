"""The service stage, free of HTTP: the gateway's state (`gateway`), a request run through its
route and attempts (`attempts`), admission in front of each backend (`admission`), the events
pumped from a backend (`event_pump`, `stream_feed`), shadows, outcomes and accounting."""
