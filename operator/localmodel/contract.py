"""The operator's contract with the cluster: every name it writes and reads back.

The renderer writes these on the objects it makes; the controller's readers
(`controller/objects.py`), its watches (`controller/watched.py`), its writer
and doctor recognise the operator's objects by them. Both sides import this
module and nothing else spells them: tests/render/test_contract.py renders
objects and reads them back through the controller's own readers, and fails
on any of these strings written out elsewhere under operator/.

Changing a value here changes what a running operator recognises as its own:
objects an older version wrote stop being seen (labels, annotations) or are
replaced (anything inside the pod spec, whose hash changes).
"""

from __future__ import annotations

from localmodel import GROUP

# Every label and annotation key of the operator and its node probe starts so.
PREFIX = f"{GROUP}/"

# The program's name where the cluster records who did something.
OPERATOR = "localmodel-operator"

# ---- labels on every object a LocalModel owns --------------------------------
LABEL_APP_NAME = "app.kubernetes.io/name"
APP_NAME = "localmodel"
LABEL_INSTANCE = "app.kubernetes.io/instance"  # the LocalModel's name
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = OPERATOR
LABEL_NAME = PREFIX + "name"  # the LocalModel's name; the Service selects pods by it
LABEL_REPLICA = PREFIX + "replica"  # pods and weights claims: the replica number
# A pod's role besides a replica's: `doorman` (render/doorman.py), the pod that
# answers a released model's Service. It carries LABEL_NAME (the Service selects
# it) and never LABEL_REPLICA (it is never counted as a replica).
LABEL_ROLE = PREFIX + "role"
ROLE_DOORMAN = "doorman"
DOORMAN_SUFFIX = "-doorman"  # the doorman pod's name: `<LocalModel name>-doorman`

# ---- annotations ---------------------------------------------------------------
ANNOTATION_NODE = PREFIX + "node"  # pods: the node the planner chose
ANNOTATION_THREADS = PREFIX + "threads"  # pods: the engine's thread count (doctor reads it)
ANNOTATION_POD_SPEC_HASH = PREFIX + "pod-spec-hash"  # pods: digest of the rendered spec
# ConfigMaps, Services: digest of the applied manifest, so an equal one is not re-applied
ANNOTATION_APPLIED_HASH = PREFIX + "applied-hash"

# ---- inside the pod --------------------------------------------------------------
VOLUME_WEIGHTS = "weights"  # the weights claim (the controller reads which claim a pod uses)
VOLUME_MODELFILE = "modelfile"  # Ollama: the tuned Modelfile from the ConfigMap
CONTAINER_GATEWAY = "gateway"
CONTAINER_PULL = "pull"  # Ollama's init container
CONTAINER_DOWNLOAD = "download"  # the GGUF download init container (either engine)
PORT_HTTP = "http"  # the gateway's port, and the Service's
PORT_ADMIN = "admin"  # the gateway's admin port (metrics, speed, ledger): not the Service's
VOLUME_KEYS = "api-keys"  # the gateway's API keys Secret (spec.gateway.auth)
PORT_ENGINE = "engine"  # the engine container's port

# ---- the operator's writes --------------------------------------------------------
FIELD_MANAGER = OPERATOR  # server-side apply and create
EVENT_SOURCE_COMPONENT = OPERATOR  # core/v1 Event `source.component`
EVENT_REPORTING_COMPONENT = PREFIX + "operator"  # Event `reportingComponent`

# ---- kopf's own storage (all of it switched off; named so it never collides) --------
KOPF_ANNOTATIONS_PREFIX = GROUP
KOPF_DIFFBASE_KEY = "last-handled-configuration"
KOPF_FINALIZER = PREFIX + "kopf-finalizer"

# The router's pods (`localmodel router`, the chart's router Deployment) carry
# this label; a model's NetworkPolicy admits pods with it from the router's
# namespace (the operator's --router-namespace) to the inference and admin ports.
LABEL_COMPONENT = "app.kubernetes.io/component"
ROUTER_POD_LABELS = {LABEL_COMPONENT: "router"}

# Labels the operator's watches select its own claims, ConfigMaps and Services by.
OWNED_SELECTOR = {LABEL_MANAGED_BY: MANAGED_BY}
