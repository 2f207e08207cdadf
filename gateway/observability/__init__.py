"""What the gateway shows of itself: Prometheus metrics (`metrics`, their values across worker
processes in `multiprocess_values` and `live_collectors`, replica load in `replica_load`), the
JSONL request log (`request_log`) and OpenTelemetry traces (`telemetry`)."""
