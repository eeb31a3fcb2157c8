"""`python -m node ...` is `pulse ...`."""

import sys

from node.commands.cli import main

sys.exit(main())
