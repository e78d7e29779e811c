"""FieldError / InvalidObject / parse_local_model / format_errors: errors carry their field."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from localmodel.api import parse_local_model
from localmodel.errors import FieldError, InvalidObject, format_errors

pytestmark = pytest.mark.unit


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "localmodel.dev/v1alpha1",
        "kind": "LocalModel",
        "metadata": {"name": "m", "namespace": "ai"},
        "spec": {"model": "qwen3:1.7b", **spec},
    }


def errors_of(obj: object) -> InvalidObject:
    with pytest.raises(InvalidObject) as info:
        parse_local_model(obj)
    return info.value


def test_field_error_is_a_value_error_with_path_and_reason() -> None:
    e = FieldError("spec.kvCache", "needs flash attention")
    assert isinstance(e, ValueError)
    assert (e.field_path, e.reason, str(e)) == (
        "spec.kvCache",
        "needs flash attention",
        "spec.kvCache: needs flash attention",
    )
    assert e.under("x") == FieldError("x.spec.kvCache", "needs flash attention")
    nested = FieldError("[0].key", "r").under("spec.tolerations")
    assert nested.field_path == "spec.tolerations[0].key"


SHA0 = "0" * 64


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ({"kvCache": "q4_0", "flashAttention": "disabled"}, "spec.kvCache", "flash attention"),
        ({"cpu": 0}, "spec.cpu", "positive integer"),
        ({"engine": {"name": "llama-server"}}, "spec.gguf", "set gguf.url"),
        (
            {"engine": {"name": "llama-server"}, "gguf": {"url": "https://h/x", "sha256": SHA0}},
            "spec.gguf.file",
            "set gguf.file",
        ),
        (
            {"placement": {"tolerations": [{"operator": "Exists"}, {"operator": "Equal"}]}},
            "spec.placement.tolerations[1].key",
            "operator Exists",
        ),
        ({"env": [{"name": "OLLAMA_HOST", "value": "x"}]}, "spec.env", "manages"),
        ({"context": 10}, "spec.context", "greater than"),
        ({"modle": "x"}, "spec.modle", "Extra inputs"),
    ],
)
def test_cross_field_and_type_errors_are_rooted_at_the_object(
    spec: dict[str, Any], path: str, words: str
) -> None:
    e = errors_of(body(**spec))
    assert (e.kind, e.name) == ("LocalModel", "ai/m")
    assert path in [f.field_path for f in e.errors], e.errors
    assert any(words in f.reason for f in e.errors if f.field_path == path)
    # The rule's message stands alone: no field path left inside the reason.
    assert not any(f.reason.startswith(f.field_path.rsplit(".", 1)[-1] + ":") for f in e.errors)


def test_every_error_is_reported_not_only_the_first() -> None:
    e = errors_of(body(cpu=0, context=10, slots=0))
    assert {"spec.cpu", "spec.context", "spec.slots"} <= {f.field_path for f in e.errors}


@pytest.mark.parametrize(
    ("obj", "name"),
    [
        (None, "?"),
        ([1, 2], "?"),
        ("text", "?"),
        ({"metadata": "x", "spec": {}}, "?"),
        ({"metadata": {"name": "n"}, "spec": 5}, "n"),
        ({"metadata": {"name": 7}}, "?"),
    ],
)
def test_anything_that_is_not_a_local_model_raises_invalid_object(obj: object, name: str) -> None:
    e = errors_of(obj)
    assert e.errors and e.name == name
    assert str(e).startswith(f"LocalModel {name}")


def test_format_errors_is_one_line_per_error_prefixed_by_where_and_object() -> None:
    errs = [FieldError("spec.cpu", "bad"), FieldError("metadata.name", "worse")]
    assert format_errors(errs) == "spec.cpu: bad\nmetadata.name: worse"
    assert format_errors(errs, where="m.yaml[1]", obj="LocalModel ai/m") == (
        "m.yaml[1]: LocalModel ai/m: spec.cpu: bad\n"
        "m.yaml[1]: LocalModel ai/m: metadata.name: worse"
    )
    assert format_errors(errs[:1] * 2, obj="LocalModel m") == "LocalModel m: spec.cpu: bad"


def test_a_valid_body_parses() -> None:
    lm = parse_local_model(body(cpu=2))
    assert lm.key == "ai/m" and lm.spec.cpu == 2


def test_nulls_in_the_spec_mean_the_default_as_the_api_server_reads_them() -> None:
    """The API server prunes a null in a non-nullable field before defaulting (the
    fuzz test found `engine: null` stored as the default): Python agrees."""
    from localmodel.api import parse_local_model

    lm = parse_local_model({"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
                            "metadata": {"name": "m"},
                            "spec": {"model": "qwen3:1.7b", "engine": None, "replicas": None,
                                     "gateway": {"maxQueue": None}}})
    assert (lm.spec.engine.name.value, lm.spec.replicas) == ("ollama", 1)
    assert lm.spec.gateway.max_queue == type(lm.spec.gateway)().max_queue  # its default


def test_nulls_in_metadata_read_as_the_api_server_decodes_them() -> None:
    """ObjectMeta is a Go struct: a null field is absent and a null label value
    is "" (seen on kube-apiserver v1.35: `labels: {a: null}` is stored as
    `{a: ""}`; the e2e fuzz found `labels: null` stored)."""
    lm = parse_local_model({"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
                            "metadata": {"name": "m", "namespace": "ai", "uid": None,
                                         "labels": {"a": None}, "annotations": None},
                            "spec": {"model": "qwen3:1.7b"}})
    assert (lm.key, lm.metadata.labels, lm.metadata.annotations) == ("ai/m", {"a": ""}, {})
    with pytest.raises(InvalidObject, match=r"metadata\.name"):
        parse_local_model({"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
                           "metadata": {"name": None}, "spec": {"model": "qwen3:1.7b"}})


def _field_patterns(model: type[Any], seen: set[type[Any]]) -> set[str]:
    """The `pattern=` of every string field pydantic checks, below `model`."""
    from pydantic import BaseModel

    if model in seen:
        return set()
    seen.add(model)
    found: set[str] = set()
    for field in model.model_fields.values():
        found |= {
            m.pattern
            for m in field.metadata
            # pydantic's own constraint, not a check from api/checks.py
            if type(m).__module__.startswith("pydantic")
            and isinstance(getattr(m, "pattern", None), str)
        }
        for arg in typing.get_args(field.annotation) or (field.annotation,):
            for inner in typing.get_args(arg) or (arg,):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    found |= _field_patterns(inner, seen)
    return found


def test_every_pattern_in_the_spec_has_words() -> None:
    """A value that fails a pattern is told what the field wants, not the regex:
    a new `pattern=` in the spec without words fails here. (Names and
    quantities are checked by api/checks.py, which words its own errors.)"""
    from localmodel.api import LocalModel
    from localmodel.api.spec import PATTERN_WORDS, LocalModelSpec

    patterns = _field_patterns(LocalModelSpec, set())
    assert LocalModel.model_fields["spec"].annotation is LocalModelSpec
    assert len(patterns) >= 10 and patterns <= set(PATTERN_WORDS), patterns - set(PATTERN_WORDS)


def test_a_pattern_error_names_what_the_field_wants_and_what_it_got() -> None:
    bad = {"apiVersion": "localmodel.dev/v1alpha1", "kind": "LocalModel",
           "metadata": {"name": "m"}, "spec": {"model": "Bad Model!" + "x" * 100}}
    with pytest.raises(InvalidObject) as info:
        parse_local_model(bad)
    [err] = info.value.errors
    assert err.field_path == "spec.model"
    assert err.reason.startswith("must be a model reference such as qwen3:1.7b")
    assert "got 'Bad Model!xxx" in err.reason and err.reason.endswith("...")
    assert "^[" not in err.reason  # no regex
