"""Every bad input in the corpus: exit 2, file + object + field + reason, nothing else.

The corpus is `tests/corpus.py`; the API server's side of the same table is
`tests/e2e/test_hostile_api.py`.
"""

from __future__ import annotations

import io
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
import yaml

from localmodel import manifest
from localmodel.cli import main
from tests.corpus import CORPUS, ENDLESS, Bad

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
QWEN = str(ROOT / "examples" / "qwen3.yaml")
NODES = str(ROOT / "examples" / "nodes-small.yaml")
HANG_GUARD_SECONDS = 20  # a hang guard, not a speed target (benchmarks measure speed)


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    def hung(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {HANG_GUARD_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_GUARD_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def render(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["render", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_bad_input_exits_2_naming_file_object_field_and_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: Bad
) -> None:
    path = tmp_path / f"{case.id}.yaml"
    path.write_bytes(case.text)
    if case.target == "nodes":
        rc, out, err = render(capsys, "-f", QWEN, "--nodes", str(path))
    else:
        rc, out, err = render(capsys, "-f", str(path), "--nodes", NODES)
    assert (rc, out) == (2, ""), err
    assert "Traceback" not in err
    assert err.startswith(f"localmodel render: {path}"), err
    if case.obj:
        assert f": {case.obj}: " in err, err
    if case.field:
        assert f"{case.field}: " in err, err
    assert case.words in err, err


def test_an_endless_file_is_refused_after_the_size_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = render(capsys, "-f", ENDLESS)
    assert (rc, out) == (2, "")
    assert f"{ENDLESS}: larger than {manifest.MAX_BYTES // 2**20} MiB" in err


def test_stdin_is_bounded_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdin:
        buffer = io.BytesIO(b"#" * (manifest.MAX_BYTES + 10))

    monkeypatch.setattr("sys.stdin", Stdin)
    rc, out, err = render(capsys, "-f", "-")
    assert (rc, out) == (2, "") and "-: larger than" in err


def test_a_directory_or_missing_file_is_a_read_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for path in (str(tmp_path), str(tmp_path / "nope.yaml")):
        rc, out, err = render(capsys, "-f", path)
        assert (rc, out) == (2, "") and f"{path}: cannot read" in err


def test_every_problem_in_a_file_is_reported_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "two.yaml"
    path.write_bytes(
        next(c for c in CORPUS if c.id == "memory-zero").text
        + b"---\n"
        + next(c for c in CORPUS if c.id == "name-digit-first").text
    )
    rc, out, err = render(capsys, "-f", str(path))
    assert (rc, out) == (2, "")
    assert f"{path}[0]: LocalModel m: spec.memory: " in err
    assert f"{path}[1]: LocalModel 9lives: metadata.name: " in err


def test_a_model_given_in_two_files_names_both(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(Path(QWEN).read_text())
    b.write_text(Path(QWEN).read_text())
    rc, out, err = render(capsys, "-f", str(a), "-f", str(b))
    assert (rc, out) == (2, "")
    assert f"{b}: LocalModel ai/qwen3: metadata.name: given more than once (also in {a})" in err


def test_anchors_within_the_budget_and_timestamps_still_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(
        "apiVersion: localmodel.dev/v1alpha1\nkind: LocalModel\n"
        "metadata:\n  name: m\n  creationTimestamp: 2026-01-01T00:00:00Z\n"
        "  labels: &sel {pool: small}\n  annotations: {<<: *sel, note: x}\n"
        "spec:\n  model: 'qwen3:1.7b'\n  cpu: 1\n"
        "  placement:\n    nodeSelector: *sel\n"
        "    tolerations: [{key: pool, operator: Equal, value: small}]\n"
    )
    rc, out, err = render(capsys, "-f", str(path), "--nodes", NODES)
    assert rc == 0, err
    assert "creationTimestamp: '2026-01-01T00:00:00Z'" in out
    model = next(yaml.safe_load_all(out))
    assert model["metadata"]["annotations"] == {"pool": "small", "note": "x"}
    assert model["spec"]["placement"]["nodeSelector"] == {"pool": "small"}


def test_the_validation_doc_states_the_limits_the_code_enforces() -> None:
    from localmodel.api.model_info import WEIGHTS_SIZE
    from localmodel.api.rules import LOADER_ENV, LOADER_ENV_PREFIX
    from localmodel.api.spec import MEMORY, STORAGE_SIZE

    doc = " ".join((ROOT / "docs" / "validation.md").read_text().split())
    for q in (MEMORY, STORAGE_SIZE, WEIGHTS_SIZE):
        assert f"{q.minimum} to {q.maximum}" in doc
    assert f"At most {manifest.MAX_BYTES // 2**20} MiB" in doc
    assert f"may be at most {manifest.MAX_YAML_BYTES // 2**20} MiB" in doc
    assert f"at most {manifest.MAX_VALUES} values" in doc
    assert f"At most {manifest.MAX_DEPTH} levels" in doc
    assert f"at most {manifest.ALIAS_BUDGET}" in doc
    assert all(f"`{name}`" in doc for name in LOADER_ENV) and f"`{LOADER_ENV_PREFIX}*`" in doc
