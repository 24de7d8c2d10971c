#!/usr/bin/env python
"""Kept so that ``python tools/make_fixtures.py ...`` keeps working: the generator is the package
tools/fixtures, run as ``python -m tools.fixtures`` (same arguments)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.fixtures.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
