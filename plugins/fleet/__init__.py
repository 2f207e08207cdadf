"""Fleets: many replicas behind one proxy backend.

- `fleet.Fleet`: the replicas of one backend — membership (discovery, draining), placement
  (a policy from `balance/`), each replica's breaker, and the load scrape loops.
- `replica.Replica`: one replica's pool, counts and last load snapshot.
- `discovery`: where the replica list comes from (`endpoints`, `dns`, `file`).
- `load_signals`: parsers of the engines' own load reports (vLLM and llama.cpp `/metrics`,
  llama.cpp `/slots`).
- `balance/`: one placement policy per file behind one small interface, built by name
  (`round_robin`, `least_busy`, `least_load`, `prefix_cache` with its prefix index).
- `options`: the `[backends.options]` knobs of all of this.
"""
