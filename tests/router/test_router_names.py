"""What a request's `model` field means to the router (router/table.py): a
name whose text before the first slash is a namespace's is that namespace's
model and nothing else, whatever another namespace serves; a bare name is a
convenience that never outranks it. And a replica's identity is its
namespace and pod (and uid), in the static and the cluster tables."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localmodel.router.cluster import (
    Endpoint,
    ModelEntry,
    SliceEntry,
    Unreadable,
    keep_slice,
    route_table,
)
from localmodel.router.static import parse_replicas
from localmodel.router.table import (
    NAMESPACE_PATTERN,
    Ambiguous,
    Found,
    ModelRoute,
    NotFound,
    Replica,
    RouteTable,
    listed_names,
    lookup,
    qualified_only_notes,
)

pytestmark = pytest.mark.unit


def _model(namespace: str, served: str) -> ModelRoute:
    pod = Replica(namespace, "p-0", f"http://{namespace}.invalid:8080", None)
    return ModelRoute(namespace, served, (pod,))


def _found(table: RouteTable, asked: str) -> str | None:
    """The qualified name of the model `asked` reaches; None when none."""
    found = lookup(table, asked)
    return found.route.qualified if isinstance(found, Found) else None


# ---- the rule, case by case -------------------------------------------------------------

CAPTURE = (_model("team-a", "chat"), _model("team-b", "team-a/chat"))


def test_a_served_name_spelling_another_namespaces_model_cannot_capture_it() -> None:
    # team-b serves `team-a/chat`: requests for team-a's `chat` still reach team-a.
    assert _found(CAPTURE, "team-a/chat") == "team-a/chat"
    assert lookup(CAPTURE, "team-a/chat") == Found(CAPTURE[0])
    # team-b's model is reached by its qualified spelling only, and listed so.
    assert lookup(CAPTURE, "team-b/team-a/chat") == Found(CAPTURE[1])
    assert listed_names(CAPTURE) == ("chat", "team-b/team-a/chat")
    assert [_found(CAPTURE, n) for n in listed_names(CAPTURE)] == [
        "team-a/chat", "team-b/team-a/chat"]


def test_an_unknown_qualified_name_is_not_found_and_never_falls_back() -> None:
    # team-a serves nothing here; team-b's served name says `team-a/chat`.
    alone = (CAPTURE[1], _model("team-c", "library/qwen3"))
    for asked in ("team-a/chat", "library/qwen3", "team-c/chat", "team-b/chat"):
        found = lookup(alone, asked)
        assert isinstance(found, NotFound), asked
        assert repr(asked) in found.message
        assert found.known == ("team-b/team-a/chat", "team-c/library/qwen3")


def test_a_name_whose_first_segment_no_namespace_can_have_stays_bare() -> None:
    hf = "hf.co/user/repo:Q4_K_M"
    one = (_model("team-a", hf), _model("team-a", "chat"))
    assert _found(one, hf) == f"team-a/{hf}"
    assert _found(one, f"team-a/{hf}") == f"team-a/{hf}"
    assert listed_names(one) == ("chat", hf)
    assert qualified_only_notes(one) == ()
    two = (*one, _model("team-b", hf))
    found = lookup(two, hf)
    assert isinstance(found, Ambiguous)
    assert found.choices == (f"team-a/{hf}", f"team-b/{hf}")
    assert _found(two, f"team-b/{hf}") == f"team-b/{hf}"
    # Upper case or a dot: no namespace is named so, so the name is bare.
    assert _found((_model("x", "Team/chat"),), "Team/chat") == "x/Team/chat"


def test_a_model_reached_only_qualified_is_said_once_per_model() -> None:
    table = (*CAPTURE, _model("team-c", "library/qwen3"), _model("team-c", "qwen3"))
    notes = qualified_only_notes(table)
    assert len(notes) == 2
    assert "'team-b/team-a/chat'" in notes[0] and "'team-c/library/qwen3'" in notes[1]


def test_static_replicas_read_the_model_as_a_request_would() -> None:
    table = parse_replicas(["team-a/chat=http://a:1", "team-b/team-a/chat=http://b:1",
                            "hf.co/u/r:q4=http://h:1", "static/library/qwen3=http://l:1"])
    assert [(r.namespace, r.name) for r in table] == [
        ("team-a", "chat"), ("team-b", "team-a/chat"), ("static", "hf.co/u/r:q4"),
        ("static", "library/qwen3")]
    assert _found(table, "team-a/chat") == "team-a/chat"
    assert [r.id for route in table for r in route.replicas] == [
        "team-a/http://a:1", "team-b/http://b:1", "static/http://h:1", "static/http://l:1"]


def test_the_cluster_table_keeps_team_as_chat_from_team_bs_capture() -> None:
    models = [ModelEntry("team-a", "chat", "chat", True),
              ModelEntry("team-b", "chat", "team-a/chat", True)]
    slices = [SliceEntry("team-a", "chat", (Endpoint("chat-0", "10.0.0.1", "uid-a"),)),
              SliceEntry("team-b", "chat", (Endpoint("chat-0", "10.0.0.2", "uid-b"),))]
    table, _ = route_table(models, slices)
    found = lookup(table, "team-a/chat")
    assert isinstance(found, Found)
    assert [r.url for r in found.route.replicas] == ["http://10.0.0.1:8080"]
    # Two pods named chat-0, one per namespace: two replicas.
    assert sorted(r.id for route in table for r in route.replicas) == [
        "team-a/chat-0@uid-a", "team-b/chat-0@uid-b"]


def _slice(ref: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": "s", "namespace": "ai",
                         "labels": {"kubernetes.io/service-name": "chat"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": True},
                           "targetRef": ref}]}


def test_a_pod_made_again_under_its_name_is_a_new_replica() -> None:
    uid = "4f1c2a9e-0b7d-4c1e-9a52-3b0f6d2e8c11"
    first = keep_slice(_slice({"kind": "Pod", "name": "chat-0", "uid": uid}))
    again = keep_slice(_slice({"kind": "Pod", "name": "chat-0", "uid": uid[::-1]}))
    assert first.endpoints == (Endpoint("chat-0", "10.0.0.7", uid),)
    ids = [route_table([ModelEntry("ai", "chat", "chat", True)], [s])[0][0].replicas[0].id
           for s in (first, again)]
    assert ids == [f"ai/chat-0@{uid}", f"ai/chat-0@{uid[::-1]}"]
    with pytest.raises(Unreadable, match=r"targetRef\.uid"):
        keep_slice(_slice({"kind": "Pod", "name": "chat-0", "uid": "a b\n"}))


# ---- the property -------------------------------------------------------------------------

NAMESPACES = ("team-a", "team-b", "library", "x", "hf")
_SEGMENT = st.sampled_from(("chat", "qwen3:0.6b", "hf.co", "Team", "a.b", "", *NAMESPACES))


@st.composite
def _served(draw: st.DrawFn) -> str:
    """A served name: plain, or with slashes, often spelling another namespace's model."""
    parts = draw(st.lists(_SEGMENT, min_size=1, max_size=4))
    name = "/".join(parts).strip("/")
    return name or "chat"


_TABLES = st.lists(st.tuples(st.sampled_from(NAMESPACES), _served()), max_size=12,
                   unique=True).map(lambda pairs: tuple(_model(ns, n) for ns, n in pairs))


@settings(max_examples=300, deadline=None)
@given(table=_TABLES, asked=st.lists(_served(), min_size=1, max_size=6))
def test_no_qualified_name_reaches_another_namespaces_model(
        table: RouteTable, asked: list[str]) -> None:
    # Whatever the others serve: namespace/name finds that namespace's model or nothing.
    for namespace in NAMESPACES:
        for name in asked + [r.name for r in table]:
            found = lookup(table, f"{namespace}/{name}")
            if isinstance(found, Found):
                assert found.route.namespace == namespace
                assert found.route.name == name
            else:
                assert isinstance(found, NotFound)
                assert (namespace, name) not in {(r.namespace, r.name) for r in table}
    # Every model is reached by its qualified name, and the listing's names each
    # reach a different model, all of them.
    for route in table:
        assert lookup(table, route.qualified) == Found(route)
    listed = listed_names(table)
    reached = [_found(table, n) for n in listed]
    assert sorted(reached, key=str) == sorted((r.qualified for r in table), key=str)
    # A name that reads as namespace/name reaches that namespace's model or none:
    # a served name equal to it in another namespace never outranks it.
    for name in asked:
        found = lookup(table, name)
        head, slash, rest = name.partition("/")
        if isinstance(found, Found) and slash and re.fullmatch(NAMESPACE_PATTERN, head):
            assert (found.route.namespace, found.route.name) == (head, rest)


def test_the_cluster_source_says_once_that_a_model_is_reached_only_qualified(
        caplog: pytest.LogCaptureFixture) -> None:
    from kubernetes import client

    from localmodel.router.follow import ClusterSource

    source = ClusterSource(client.ApiClient(), namespaces=("team-b",))  # never started
    source.models[0].kept.entries[("team-b", "chat")] = ModelEntry(
        "team-b", "chat", "team-a/chat", True)
    with caplog.at_level("WARNING", logger="localmodel.router.cluster"):
        for _ in range(3):
            source._changed()
            assert [r.qualified for r in source.routes()] == ["team-b/team-a/chat"]
    said = [r.getMessage() for r in caplog.records if "reaches it only" in r.getMessage()]
    assert said == ["model team-b/team-a/chat: its served name 'team-a/chat' reads as "
                    "namespace/name, so the router reaches it only as 'team-b/team-a/chat'"]
