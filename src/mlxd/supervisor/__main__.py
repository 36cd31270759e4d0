import sys

from mlxd.supervisor.cli import main

sys.exit(main())
