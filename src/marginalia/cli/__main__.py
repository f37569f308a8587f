"""`python -m marginalia.cli`."""

import sys

from . import main

sys.exit(main())
