"""``python -m hwplace``: the same as the ``hwplace`` command."""

from hwplace.application.cli import main

raise SystemExit(main())
