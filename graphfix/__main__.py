"""`python -m graphfix …` runs the command line."""

import sys

from graphfix.cli.main import main

sys.exit(main())
