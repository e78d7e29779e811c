"""What the renderer is given: the options of a render, and each placed
replica with its tuning (and the weights claim it mounts)."""

from __future__ import annotations

from dataclasses import dataclass

from localmodel.api import LocalModel
from localmodel.images import with_registry
from localmodel.render.names import DEFAULT_OPERATOR_IMAGE, DEFAULT_OPERATOR_NAMESPACE, claim_name
from localmodel.rules.model import Tuning


@dataclass(frozen=True)
class RenderOptions:
    """The operator's choices that the render reads beside the model: images, downloads, network
    policy and registry."""

    operator_image: str = DEFAULT_OPERATOR_IMAGE
    pull_policy: str = "IfNotPresent"
    # GGUF downloads over plain http (the operator's --allow-http-downloads);
    # https only otherwise, and never https -> http on a redirect.
    allow_http_downloads: bool = False
    # A NetworkPolicy per model unless its spec.gateway.networkPolicy.enabled
    # says otherwise (the operator's --network-policy, the chart's default).
    network_policy: bool = False
    # Namespaces whose pods may reach the gateways' admin port under it: the
    # operator's own first (it reads /speed), then e.g. Prometheus's.
    admin_namespaces: tuple[str, ...] = (DEFAULT_OPERATOR_NAMESPACE,)
    # The one registry setting (localmodel/images.py; the operator's
    # --image-registry, the chart's global.imageRegistry): the images the
    # operator chooses (the gateway and download step's operator image, each
    # engine's pinned image) come from it; an image a LocalModel names is kept.
    image_registry: str = ""
    # Secrets (in each model's namespace) every model pod pulls its images with.
    image_pull_secrets: tuple[str, ...] = ()
    # The namespace of the router's pods (contract.ROUTER_POD_LABELS) the
    # policy admits to both ports (the operator's --router-namespace); empty: none.
    router_namespace: str = ""
    # The router's public key (gateway_contract/marks.py), read by the operator from the
    # router's signing Secret; every gateway is given it (--router-key) with
    # its pod's identity. Empty: no router, nothing rendered for it.
    router_key: str = ""
    # The router's address a released model's doorman names to its callers
    # (render/doorman.py; the operator's --router-url, the chart's router
    # Service when the router is on). Empty: the doorman names no router.
    router_url: str = ""

    def __post_init__(self) -> None:
        # The operator image as the pods run it: under the registry setting.
        object.__setattr__(self, "operator_image",
                           with_registry(self.operator_image, self.image_registry))


@dataclass(frozen=True)
class ReplicaPlan:
    """One placed replica with its tuning: the renderer's input per pod."""

    replica: int
    node: str
    tuning: Tuning
    reason: str = ""
    # The weights claim this replica mounts; empty: the default name. The
    # operator picks another when the default claim is bound to a volume the
    # replica's new node cannot reach.
    claim: str = ""


def replica_claim(lm: LocalModel, r: ReplicaPlan) -> str:
    """The weights claim a replica mounts: its plan's, else the default name."""
    return r.claim or claim_name(lm, r.replica)
