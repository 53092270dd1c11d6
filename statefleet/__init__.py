"""The composition root: it finds the service plugins, puts together the kinds and the
controllers of every layer below, and is the `statefleet` command (and kubectl plugin)."""
