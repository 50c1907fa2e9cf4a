import sys

from server.cli.entry import main

sys.exit(main())
