"""`python -m kermac`: the `kermac` command line."""

from kermac.cli import main

raise SystemExit(main())
