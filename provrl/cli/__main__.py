"""``python -m provrl.cli …`` is ``provrl …``."""

import sys

from provrl.cli.entry import main

sys.exit(main())
