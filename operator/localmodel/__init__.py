"""localmodel-operator: run local LLMs on CPU-only Kubernetes nodes, tuned per node."""

__version__ = "0.2.0"

GROUP = "localmodel.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LocalModel"
PLURAL = "localmodels"
