import sys

from hyflash.cli import main

sys.exit(main())
