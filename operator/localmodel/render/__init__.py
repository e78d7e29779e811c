"""Pure renderer: a LocalModel, its placements and their tunings -> manifests.

No client, no clock: the caller passes the time and the operator image. One
module per job:

- `names`: names, labels and owner references, and the constants other
  modules need (import it, not the renderer, for a name);
- `plan`: what the renderer is given (`RenderOptions`, `ReplicaPlan`);
- `pods`: a pod spec and its pieces; the engine's containers, init steps and
  probes come from its adapter's pod part (engines/pod.py, asked by
  `engine(name)`: nothing here branches on an engine), `gateway` the sidecar;
- `applied`: the ConfigMap and the Service, which the operator applies;
- `objects`: every object of one model (`render_objects`);
- `digests`: the digests the operator compares, and the pass's shortcuts to
  them (`PodParts`, `AppliedDigests`).
"""

from localmodel.podspec import Manifest
from localmodel.render.applied import (
    applied_objects,
    configmap_data,
    render_configmap,
    render_service,
)
from localmodel.render.digests import (
    AppliedDigests,
    PodParts,
    affinity_text,
    applied_hashes,
    manifest_hash,
    pod_digest,
    pod_spec_hash,
    volumes_text,
)
from localmodel.render.gateway import build_gateway_container, gateway_env, gateway_secret_env
from localmodel.render.objects import render_claim, render_objects, render_pod
from localmodel.render.plan import RenderOptions, ReplicaPlan, replica_claim
from localmodel.render.pods import build_containers, build_pod_spec, engine_pod

__all__ = [
    "AppliedDigests",
    "Manifest",
    "PodParts",
    "RenderOptions",
    "ReplicaPlan",
    "affinity_text",
    "applied_hashes",
    "applied_objects",
    "build_containers",
    "build_gateway_container",
    "build_pod_spec",
    "configmap_data",
    "engine_pod",
    "gateway_env",
    "gateway_secret_env",
    "manifest_hash",
    "pod_digest",
    "pod_spec_hash",
    "render_claim",
    "render_configmap",
    "render_objects",
    "render_pod",
    "render_service",
    "replica_claim",
    "volumes_text",
]
