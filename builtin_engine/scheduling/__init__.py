"""What the scheduler schedules: one sequence per choice of a request (`sequence`), with the
request's sampling parameters (`sampling_params`), its paged KV blocks (`block_manager`), and the
continuous batching that picks each step's work (`scheduler`)."""
