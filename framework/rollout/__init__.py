"""The StatefulsetRollout controller: percent-based, parallel, pausable, reversible rollouts
of StatefulSets, without the version leak. Services delegate their rollouts to it; any team
can use it alone."""
