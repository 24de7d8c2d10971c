"""The pipeline: transforms with their options, producing verified variants, and release builds."""
