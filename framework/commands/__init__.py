"""`statefleet` (and `kubectl statefleet`) commands for users, one folder per noun, one module
per verb. Each verb module has `add(parsers)` and `run(args, kube) -> int`."""
