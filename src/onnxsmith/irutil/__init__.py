"""Small IR utilities every layer above uses: walking a model, names, types.

Each is here once: one node-label format, one fresh-name generator, one type inference.
"""
