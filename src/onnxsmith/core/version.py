"""The version stamped into provenance and cards (here, low, so any layer may read it)."""

__version__ = "0.1.0"
