"""The proxy backend types — `vllm`, `llamacpp` (its grammars compiled by `gbnf`),
`openai_compatible` — over one shared core (`backend`): the upstream stream read into events
(`stream`, `normalize`) and embeddings (`embeddings`), both through the public hop to the servers
(`upstream`: replicas, pools, timeouts), with options (`options`) and upstream errors mapped once
(`errors`) beneath them. Imports run in that order, never back up."""
