import sys

from onnxsmith.cli.main import main

sys.exit(main())
