"""``python -m hwplace``: the same as the ``hwplace`` command."""

from hwplace.cli import main

raise SystemExit(main())
