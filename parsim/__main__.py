import sys

from parsim.cli.main import main

sys.exit(main())
