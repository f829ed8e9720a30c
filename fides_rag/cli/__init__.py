"""The `fides-rag` command and its subcommands."""
