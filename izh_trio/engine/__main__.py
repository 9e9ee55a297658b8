import sys

from izh_trio.engine.process import main

sys.exit(main())
