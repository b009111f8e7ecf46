"""``python -m lra.collect``: see lra/collect/__init__.py."""

import sys

from lra.collect import main

sys.exit(main())
