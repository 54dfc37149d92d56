"""BFCL v4 multi-turn function calling (needs the optional ``bfcl-eval`` package; imported lazily)."""
