"""The math, pure functions: GRPO advantages and losses (algos), intervals and paired tests (stats), shared-prefix
grouping (prefixes)."""
