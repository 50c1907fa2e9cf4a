"""`python -m agent`: the host agent (agent.cli)."""

import sys

from agent.cli import main

sys.exit(main())
