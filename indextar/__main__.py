"""``python -m indextar``: the same CLI as the ``indextar`` console script."""

import sys

from .cli.commands import main

sys.exit(main())
