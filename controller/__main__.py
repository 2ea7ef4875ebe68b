"""``python -m controller start ...`` is ``orion-controller start ...``."""
import sys

from controller.cli import main

sys.exit(main())
