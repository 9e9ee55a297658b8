import sys

from izh_trio.cli import main

sys.exit(main())
