"""The resource the verbs act on (lightkube's class, without importing the plugin)."""

from __future__ import annotations

from lightkube.generic_resource import create_namespaced_resource

from framework.kube.meta import GROUP, VERSION

POSTGRES = create_namespaced_resource(GROUP, VERSION, "Postgres", "postgreses")
