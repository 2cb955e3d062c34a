"""`python -m swiftspec.cli`: the `swiftspec` command."""

import sys

from swiftspec.cli.main import main

sys.exit(main())
