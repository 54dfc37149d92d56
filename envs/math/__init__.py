"""Math reasoning with a sandboxed Python tool: generated tasks, dataset loaders, math-verify reward."""
