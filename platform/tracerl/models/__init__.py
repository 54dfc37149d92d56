"""Policy models: the built-in tiny policy (tokenizer + small causal LM) and its supervised warm start."""
