"""A real Kubernetes control plane on loopback for the e2e tests and the demo.

See docs/test-cluster.md. Binaries come from hack/build-tools.sh.
"""

from tests.harness.cluster import ADMIN, OPERATOR, OPERATOR_USER, TestCluster
from tests.harness.kubeapi import ApiError, KubeApi
from tests.harness.processes import StartupError
from tests.harness.tools import Tools, ToolsMissingError, locate_tools

__all__ = [
    "ADMIN",
    "OPERATOR",
    "OPERATOR_USER",
    "ApiError",
    "KubeApi",
    "StartupError",
    "TestCluster",
    "Tools",
    "ToolsMissingError",
    "locate_tools",
]
