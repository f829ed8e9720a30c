"""`python -m fides_rag.cli`: the `fides-rag` command."""

from fides_rag.cli.main import main

raise SystemExit(main())
