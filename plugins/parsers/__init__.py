"""Text parsers every backend shares, whether the text came from the built-in engine or an
upstream server: tool calls out of model text (`tools`) and a model's thinking split from its
answer (`reasoning`)."""
