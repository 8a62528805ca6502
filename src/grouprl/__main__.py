"""``python -m grouprl ...``: the same command line as the ``grouprl`` script."""

from grouprl.cli import main

raise SystemExit(main())
