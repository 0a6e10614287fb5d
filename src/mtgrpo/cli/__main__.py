"""`python -m mtgrpo.cli ...` (what `accelerate launch -m mtgrpo.cli` runs)."""

import sys

from mtgrpo.cli import main

sys.exit(main())
