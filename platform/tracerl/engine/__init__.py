"""Pure rollout engine: the allocation-and-rollout step over a tree backend, and the budget ledger."""
