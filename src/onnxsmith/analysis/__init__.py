"""Analysis: reading a model without changing it (structure, sizes, types, activation ranges)."""
