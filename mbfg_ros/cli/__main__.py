import sys

from mbfg_ros.cli.commands import main

sys.exit(main())
