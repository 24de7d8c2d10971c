"""Verification: a variant compared with its source (every output, or a task's gate), and where it went wrong."""
