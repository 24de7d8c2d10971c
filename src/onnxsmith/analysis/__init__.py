"""Analysis: reading a model without running it (structure, sizes, types, shapes, bounds, precision policy)."""
