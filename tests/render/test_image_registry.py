"""The one registry setting (localmodel/images.py, issue 31): how an image is
taken from the user's registry, as tables and properties; the flags that set it
(the operator's and `localmodel render`'s) and what they refuse; every image the
operator chooses under it in rendered pods, and the pull secrets on them; an
image a LocalModel names kept; and the admin policy judging the image a pod
would run."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localmodel.commands import render_main
from localmodel.controller.config import ConfigError, parse_config
from localmodel.engines import SHIPPED
from localmodel.images import split_image, with_registry
from localmodel.render import RenderOptions
from localmodel.tenancy import TenantPolicy, image_location, refusals
from tests.builders import MakeLocalModel

pytestmark = pytest.mark.unit

REGISTRY = "registry.corp:5000"

WITH_REGISTRY = [
    # (image, registry, expected)
    ("docker.io/ollama/ollama:0.0.1", REGISTRY, f"{REGISTRY}/ollama/ollama:0.0.1"),
    ("ghcr.io/ggml-org/llama.cpp:server-b100", REGISTRY,
     f"{REGISTRY}/ggml-org/llama.cpp:server-b100"),
    ("ghcr.io/localmodel/localmodel-operator:0.1.0", "mirror.example.com/team",
     "mirror.example.com/team/localmodel/localmodel-operator:0.1.0"),
    # no registry named: docker.io's; one component: under library/
    ("ollama/ollama:0.0.1", REGISTRY, f"{REGISTRY}/ollama/ollama:0.0.1"),
    ("busybox", REGISTRY, f"{REGISTRY}/library/busybox"),
    ("busybox:1.36", REGISTRY, f"{REGISTRY}/library/busybox:1.36"),
    # a host with a port, localhost, a digest
    ("localhost:5000/a/b:1", REGISTRY, f"{REGISTRY}/a/b:1"),
    ("localhost/a:1", REGISTRY, f"{REGISTRY}/a:1"),
    ("quay.io/x/y@sha256:" + "a" * 64, REGISTRY, f"{REGISTRY}/x/y@sha256:" + "a" * 64),
    ("quay.io/x/y:2@sha256:" + "b" * 64, REGISTRY, f"{REGISTRY}/x/y:2@sha256:" + "b" * 64),
    # already under it: kept (the prefix applied twice is applied once)
    (f"{REGISTRY}/ollama/ollama:1", REGISTRY, f"{REGISTRY}/ollama/ollama:1"),
    ("mirror.example.com/team/x:1", "mirror.example.com/team", "mirror.example.com/team/x:1"),
    # no registry setting: as it is
    ("docker.io/ollama/ollama:0.0.1", "", "docker.io/ollama/ollama:0.0.1"),
    ("busybox", "", "busybox"),
]


@pytest.mark.parametrize(("image", "registry", "expected"), WITH_REGISTRY,
                         ids=[f"{c[0]}@{c[1] or 'none'}" for c in WITH_REGISTRY])
def test_with_registry(image: str, registry: str, expected: str) -> None:
    assert with_registry(image, registry) == expected


def test_split_image_reads_references_as_the_policy_does() -> None:
    """One reading of a reference: the registry and path `split_image` gives are
    the location the admin policy matches (tenancy.image_location)."""
    for image, _, _ in WITH_REGISTRY:
        host, path, _ = split_image(image)
        assert image_location(image) == f"{host}/{path}"


_COMPONENT = st.from_regex(r"[a-z0-9]{1,8}(-[a-z0-9]{1,4})?", fullmatch=True)
_HOSTS = st.sampled_from(["docker.io", "ghcr.io", "quay.io", "localhost:5000", "a.b.c:443"])
_TAGS = st.sampled_from(["", ":1", ":v0.1.0", "@sha256:" + "c" * 64])
_REGISTRIES = st.sampled_from([REGISTRY, "mirror.example.com/team/sub", "10.0.0.1:5000"])


@given(_HOSTS, st.lists(_COMPONENT, min_size=1, max_size=3), _TAGS, _REGISTRIES)
def test_the_host_is_replaced_and_the_rest_kept(
    host: str, path: list[str], tag: str, registry: str
) -> None:
    image = f"{host}/{'/'.join(path)}{tag}"
    once = with_registry(image, registry)
    assert with_registry(once, registry) == once  # idempotent
    assert once == f"{registry}/{'/'.join(path)}{tag}"
    assert image_location(once).startswith(registry + "/")


# ---- the flags -----------------------------------------------------------------

BAD_REGISTRIES = [
    ("https://registry.corp", "scheme"),
    ("registry.corp/", "ends with '/'"),
    ("Registry.Corp", "host[:port][/path]"),
    ("registry corp", "host[:port][/path]"),
    ("registry.corp:port", "host[:port][/path]"),
    ("r" * 300, "at most 253"),
]


@pytest.mark.parametrize(("value", "why"), BAD_REGISTRIES, ids=[b[0][:30] for b in BAD_REGISTRIES])
def test_a_bad_registry_is_refused_naming_the_flag(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match="--image-registry") as exc:
        parse_config([f"--image-registry={value}"], {})
    assert why in str(exc.value)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = render_main(["-f", "examples/qwen3.yaml", "--nodes", "examples/nodes-avx2.yaml",
                            "--image-registry", value])
    assert code == 2 and "--image-registry" in err.getvalue() and why in err.getvalue()


@pytest.mark.parametrize(("value", "why"), [
    ("Regcred", "not a Secret name"), ("a,a", "named twice"),
    (",".join(f"s{i}" for i in range(17)), "at most 16"),
])
def test_bad_pull_secrets_are_refused_naming_the_flag(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match="--image-pull-secrets") as exc:
        parse_config([f"--image-pull-secrets={value}"], {})
    assert why in str(exc.value)


def test_the_flags_and_their_variables() -> None:
    config = parse_config(["--image-registry", REGISTRY, "--image-pull-secrets", "a, b"], {})
    assert (config.image_registry, config.image_pull_secrets) == (REGISTRY, ("a", "b"))
    assert config.tenants.image_registry == REGISTRY  # what the policy judges with
    env = parse_config([], {"LOCALMODEL_IMAGE_REGISTRY": "r.example",
                            "LOCALMODEL_IMAGE_PULL_SECRETS": "c"})
    assert (env.image_registry, env.image_pull_secrets) == ("r.example", ("c",))
    unset = parse_config([], {})
    assert (unset.image_registry, unset.image_pull_secrets, unset.tenants.image_registry) == (
        "", (), "")


# ---- rendered pods -------------------------------------------------------------


def _render(*flags: str, model: str = "examples/qwen3.yaml") -> list[dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert render_main(["-f", model, "--nodes", "examples/nodes-avx2.yaml",
                            "-o", "json", *flags]) == 0
    return [o for o in json.loads(out.getvalue())["items"] if o.get("kind") == "Pod"]


def _images(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    return [c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]]


MODELS = ("examples/qwen3.yaml", "examples/gemma-llama-server.yaml",
          "examples/gemma-ollama-airgapped.yaml")


@pytest.mark.parametrize("model", MODELS)
def test_every_image_the_operator_chooses_comes_from_the_registry(model: str) -> None:
    """Ollama's pinned image (its init step and server), llama-server's, the
    gateway's and the download step's operator image, with each model pod
    carrying the pull secrets; unset, the same pods as before."""
    plain = _render(model=model)
    pods = _render("--image-registry", REGISTRY, "--image-pull-secrets", "regcred,other",
                   model=model)
    assert pods and len(pods) == len(plain)
    for pod, before in zip(pods, plain, strict=True):
        assert "imagePullSecrets" not in before["spec"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
        images = _images(pod)
        assert images == [with_registry(i, REGISTRY) for i in _images(before)]
        assert all(i.startswith(REGISTRY + "/") for i in images)


def test_the_examples_cover_every_image_the_operator_chooses() -> None:
    seen = {i for m in MODELS for p in _render(model=m) for i in _images(p)}
    assert {f.IMAGE for f in SHIPPED} | {RenderOptions().operator_image} <= seen


def test_an_image_the_model_names_is_kept(tmp_path: Any) -> None:
    own = tmp_path / "own.yaml"
    own.write_text(json.dumps(MakeLocalModel("own").spec(
        model="qwen3:1.7b", cpu=2, engine={"name": "ollama", "image": "quay.io/me/ollama:1"},
        gateway={"image": "quay.io/me/gateway:2"}).manifest()))
    [pod] = _render("--image-registry", REGISTRY, model=str(own))
    assert set(_images(pod)) == {"quay.io/me/ollama:1", "quay.io/me/gateway:2"}


def test_render_options_put_the_operator_image_under_the_registry() -> None:
    options = RenderOptions("ghcr.io/localmodel/localmodel-operator:9", image_registry=REGISTRY)
    assert options.operator_image == f"{REGISTRY}/localmodel/localmodel-operator:9"
    assert RenderOptions("x.io/a:1").operator_image == "x.io/a:1"


# ---- the admin policy ----------------------------------------------------------

OWN = TenantPolicy(image_registries=(REGISTRY,))


def test_the_policy_judges_the_image_a_pod_would_run() -> None:
    """A model naming no image runs the pinned one under the registry: allowed
    when the policy lists the registry, refused (saying so) when it does not.
    The setting does not widen the policy: an image a tenant names from the
    registry is judged as any other."""
    plain = MakeLocalModel("chat", "team-a").spec(model="qwen3:1.7b", cpu=2).obj()
    assert refusals(plain, OWN) != ()  # docker.io's pinned image, no registry setting
    under = TenantPolicy(image_registries=(REGISTRY,), image_registry=REGISTRY)
    assert refusals(plain, under) == ()
    [refused] = refusals(plain, TenantPolicy(image_registries=("docker.io/ollama",),
                                             image_registry=REGISTRY))
    assert refused.field == "spec.engine.image"
    assert f"{REGISTRY}/ollama/ollama" in refused.reason
    assert "--image-registry" in refused.reason
    named = MakeLocalModel("chat", "team-a").spec(
        model="qwen3:1.7b", cpu=2, engine={"name": "ollama", "image": "ghcr.io/evil/x:1"}).obj()
    assert [r.field for r in refusals(named, under)] == ["spec.engine.image"]
