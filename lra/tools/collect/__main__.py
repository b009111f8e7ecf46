"""``python -m lra.tools.collect``: see lra/tools/collect/__init__.py."""

import sys

from lra.tools.collect import main

sys.exit(main())
