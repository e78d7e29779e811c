"""What the router reads of LocalModels and EndpointSlices (router/cluster.py)
and the table it builds from them; the watch glue on lines and events
(router/follow.py). The same against a real API server: tests/e2e/test_router_source.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from localmodel.router.cluster import (
    MAX_ENDPOINTS,
    Endpoint,
    ModelEntry,
    SliceEntry,
    Unreadable,
    keep_model,
    keep_slice,
    route_table,
)
from localmodel.router.follow import Follower, WatchGone, lines
from localmodel.router.table import Replica
from tests.builders import MakeLocalModel

pytestmark = pytest.mark.unit

Raw = dict[str, Any]


def a_slice(endpoints: list[Raw], service: str = "qwen3", ns: str = "ai",
            address_type: str = "IPv4") -> Raw:
    return {"metadata": {"name": f"{service}-x1", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": address_type, "endpoints": endpoints}


def endpoint(pod: str, ip: str, **conditions: bool) -> Raw:
    return {"addresses": [ip], "conditions": conditions,
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "ai"}}


def test_a_model_is_kept_by_its_served_name() -> None:
    body = MakeLocalModel("qwen3", "ai").spec(model="qwen3:1.7b").manifest()
    assert keep_model(body) == ModelEntry("ai", "qwen3", "qwen3:1.7b", True)
    off = MakeLocalModel("raw", "ai").spec(gateway={"enabled": False}).manifest()
    assert keep_model(off).gateway is False


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"spec": {}}, "spec.model"),
        ({"spec": {"model": 7}}, "spec.model"),
        ({"spec": {"model": "no spaces allowed"}}, "spec.model"),
        ({"spec": {"model": "x" * 201}}, "spec.model"),
        ({"spec": "a string"}, "spec: not an object"),
        ({"spec": {"model": "m", "gateway": {"enabled": "yes"}}}, "spec.gateway.enabled"),
        ({"spec": {"model": "m", "gateway": []}}, "spec.gateway"),
        ({"metadata": {"name": "m"}}, "metadata.namespace"),
        ({"metadata": {"namespace": "ai", "name": "n" * 254}}, "metadata.name"),
    ],
)
def test_an_unreadable_model_names_the_field(change: Raw, field: str) -> None:
    body = {"metadata": {"name": "m", "namespace": "ai"}, "spec": {"model": "m"}} | change
    with pytest.raises(Unreadable, match=field.replace(".", r"\.").replace("[", r"\[")):
        keep_model(body)


def test_a_slice_keeps_its_ready_endpoints_only() -> None:
    body = a_slice([
        endpoint("qwen3-0", "10.0.0.7", ready=True),
        endpoint("qwen3-1", "10.0.0.8", ready=False),  # not Ready
        endpoint("qwen3-2", "10.0.0.9", ready=True, terminating=True),  # going
        endpoint("qwen3-3", "10.0.0.10"),  # unknown: taken as ready (discovery.k8s.io/v1)
        {"addresses": ["10.0.0.11"], "conditions": {"ready": True}},  # no pod: named by its IP
    ])
    kept = keep_slice(body)
    assert (kept.namespace, kept.service) == ("ai", "qwen3")
    assert kept.endpoints == (Endpoint("qwen3-0", "10.0.0.7"), Endpoint("qwen3-3", "10.0.0.10"),
                              Endpoint("10.0.0.11", "10.0.0.11"))


def test_a_slice_is_bounded_and_fqdn_slices_hold_nothing() -> None:
    many = [endpoint(f"p{i}", f"10.1.{i // 256}.{i % 256}") for i in range(1000)]
    assert len(keep_slice(a_slice(many)).endpoints) == MAX_ENDPOINTS
    assert keep_slice(a_slice([endpoint("p", "10.0.0.1")], address_type="FQDN")).endpoints == ()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (a_slice([endpoint("p", "not-an-ip")]), r"endpoints\[0\]\.addresses\[0\]"),
        (a_slice([{"conditions": {}}]), r"endpoints\[0\]\.addresses"),
        (a_slice(["x"]), r"endpoints\[0\]: not an object"),
        (a_slice([endpoint("p", "10.0.0.1") | {"targetRef": {"kind": "Pod", "name": 3}}]),
         r"targetRef\.name"),
        (a_slice([]) | {"endpoints": {"a": 1}}, "endpoints: not a list"),
        ({"metadata": {"name": "s", "namespace": "ai"}, "addressType": "IPv4"},
         "kubernetes.io/service-name"),
    ],
)
def test_an_unreadable_slice_names_the_field(body: Raw, field: str) -> None:
    with pytest.raises(Unreadable, match=field):
        keep_slice(body)


def test_the_table_has_each_model_with_its_ready_replicas_by_pod_name() -> None:
    models = [ModelEntry("ai", "qwen3", "qwen3:1.7b", True),
              ModelEntry("web", "gemma", "gemma3:270m", True),
              ModelEntry("ai", "idle", "idle:1b", True)]
    slices = [SliceEntry("ai", "qwen3", (Endpoint("qwen3-1", "10.0.0.8"),)),
              # a second slice of the same Service, one endpoint in both (during a move)
              SliceEntry("ai", "qwen3", (Endpoint("qwen3-0", "10.0.0.7"),
                                         Endpoint("qwen3-1", "10.0.0.8"))),
              SliceEntry("web", "gemma", (Endpoint("gemma-0", "fd00::5"),)),
              SliceEntry("ai", "gemma", (Endpoint("stray", "10.9.9.9"),))]  # other namespace
    table, shadowed = route_table(models, slices)
    assert shadowed == ()
    assert [(r.namespace, r.name) for r in table] == [
        ("ai", "idle:1b"), ("ai", "qwen3:1.7b"), ("web", "gemma3:270m")]
    assert table[0].replicas == ()  # no Ready replica yet: listed, nothing to route to
    assert table[1].replicas == (
        Replica("ai", "qwen3-0", "http://10.0.0.7:8080", "http://10.0.0.7:8090"),
        Replica("ai", "qwen3-1", "http://10.0.0.8:8080", "http://10.0.0.8:8090"))
    assert table[2].replicas == (Replica("web", "gemma-0", "http://[fd00::5]:8080",
                                         "http://[fd00::5]:8090"),)


def test_one_served_name_twice_in_a_namespace_routes_the_first_and_says_so() -> None:
    models = [ModelEntry("ai", "zz", "qwen3:1.7b", True),
              ModelEntry("ai", "aa", "qwen3:1.7b", True),
              ModelEntry("web", "other", "qwen3:1.7b", True),  # another namespace: both routed
              ModelEntry("ai", "raw", "raw:1b", False)]  # no gateway: not routed
    slices = [SliceEntry("ai", "zz", (Endpoint("zz-0", "10.0.0.1"),)),
              SliceEntry("ai", "aa", (Endpoint("aa-0", "10.0.0.2"),))]
    table, shadowed = route_table(models, slices)
    assert [(r.qualified, [x.name for x in r.replicas]) for r in table] == [
        ("ai/qwen3:1.7b", ["aa-0"]), ("web/qwen3:1.7b", [])]
    [s] = shadowed
    assert (s.name, s.by) == ("zz", "aa") and "requests for it go to aa" in s.message


def test_lines_are_split_and_bounded() -> None:
    chunks = iter([b'{"a":', b'1}\n{"b":2}\n\n{"c"', b":3}"])
    assert list(lines(chunks)) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    with pytest.raises(ValueError, match="over 10 bytes"):
        list(lines(iter([b"x" * 11]), limit=10))


def _follower() -> tuple[Follower[ModelEntry], list[int]]:
    changes: list[int] = []
    f = Follower("LocalModels", lambda **kw: None, keep_model, lambda: changes.append(1),
                 threading.Lock())
    return f, changes


def test_events_change_what_is_kept_and_a_bad_object_only_drops_itself() -> None:
    f, changes = _follower()
    good = MakeLocalModel("qwen3", "ai").manifest()
    f.event({"type": "ADDED", "object": good})
    assert list(f.kept.entries) == [("ai", "qwen3")]
    # The same object turned unreadable: dropped (it is no longer what was kept), logged.
    f.event({"type": "MODIFIED", "object": good | {"spec": {"model": 5}}})
    assert f.kept.entries == {}
    f.event({"type": "ADDED", "object": good})
    f.event({"type": "ADDED", "object": {"metadata": "broken"}})  # no key at all: ignored
    assert f.event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}) == "9"
    assert f.event({"type": "BOOKMARK", "object": "junk"}) == ""
    assert list(f.kept.entries) == [("ai", "qwen3")]
    f.event({"type": "DELETED", "object": good})
    assert f.kept.entries == {} and len(changes) == 5
    with pytest.raises(WatchGone):
        f.event({"type": "ERROR", "object": {"code": 410, "message": "too old"}})
    with pytest.raises(RuntimeError, match="watch error 500"):
        f.event({"type": "ERROR", "object": {"code": 500, "message": "boom"}})


def test_the_hook_names_a_bad_kubeconfig_and_bad_namespaces(tmp_path: Any) -> None:
    import argparse

    from localmodel.router.source import (
        SourceUnavailable,
        add_cluster_flags,
        cluster_source,
    )

    p = argparse.ArgumentParser()
    add_cluster_flags(p)
    missing = tmp_path / "none.yaml"
    with pytest.raises(SourceUnavailable, match=f"kubeconfig {missing}"):
        cluster_source(p.parse_args(["--kubeconfig", str(missing)]))
    assert p.parse_args(["--namespaces", "ai, web,ai"]).namespaces == ("ai", "web")
    with pytest.raises(SystemExit):
        p.parse_args(["--namespaces", "Not_A_Namespace"])
