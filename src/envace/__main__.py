"""``python -m envace``: the ``envace`` command line."""

import sys

from .cli import main

sys.exit(main())
