"""``tracerl bootstrap``: the shipped tiny policies (policy), the search-tool variant (search) and the
tool-skipping habit (habit). Imports ops.

Public face: ``policy.bootstrap``.
"""
