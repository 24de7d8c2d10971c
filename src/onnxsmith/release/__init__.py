"""Releases: a source to verified variants on disk, and whole releases (recipe, build, validate, bench, card, report)."""
