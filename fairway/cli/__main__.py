"""`python -m fairway.cli ...`: the `fairway` command without its console script."""

import sys

from fairway.cli import main

sys.exit(main())
