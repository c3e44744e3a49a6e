"""``python -m trainer``: see ``trainer.cli``."""

import sys

from trainer.cli import main

sys.exit(main())
