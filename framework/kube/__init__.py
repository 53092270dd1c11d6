"""The Kubernetes core: names, labels, conditions, status patches, Events, the work queue, Jobs,
CRDs from pydantic models. It imports nothing else of Statefleet's: the rollout controller, the
platform framework, the backup engine and the services all stand on it."""
