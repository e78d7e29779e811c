"""Building blocks for pytest fixtures. What a test needs and cannot have fails
the test with the reason (never skips it): a green run means the tests ran."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.harness import engines
from tests.harness.cluster import ApiError, StartupError, TestCluster
from tests.harness.operator import OperatorProcess, install_operator
from tests.harness.realnode import NODE_TOOLS
from tests.harness.tools import TOOL_NAMES, Tools, ToolsMissingError, locate_tools


def tools_or_fail(required: tuple[str, ...] = TOOL_NAMES) -> Tools:
    """`locate_tools` for a fixture: a binary that is not built fails the test
    with the command that builds it, without a traceback."""
    try:
        return locate_tools(required)
    except ToolsMissingError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)


def real_node_parts_or_fail(what: str) -> tuple[Tools, Path]:
    """The tools a real-node cluster needs and the model's file: one that is not
    built fails the test (`what` cannot run), without a traceback."""
    try:
        return locate_tools(TOOL_NAMES + NODE_TOOLS), engines.require("model")
    except (ToolsMissingError, engines.EngineMissingError) as exc:
        message = f"{what} cannot run: {exc}"
    pytest.fail(message, pytrace=False)


def real_node_started_or_fail(cluster: TestCluster) -> None:
    """Start a real-node cluster (its registry and images first): one that does
    not start fails the test, without a traceback."""
    try:
        cluster.start(timeout=300)
        return
    except (StartupError, ApiError, OSError) as exc:
        message = f"the real-node cluster did not start: {exc}"
    pytest.fail(message, pytrace=False)


@contextmanager
def operator_cluster(tools: Tools, fixture: Path, *, audit: bool = False) -> Iterator[TestCluster]:
    """A test cluster of `fixture`'s nodes with the operator's CRD and RBAC
    installed and the local disks as the default StorageClass (as a bare-metal
    admin sets it); stopped afterwards."""
    cluster = TestCluster(fixture=fixture, tools=tools, audit=audit)
    problem = ""
    try:
        cluster.start()
        install_operator(cluster)
        cluster.kubectl("annotate", "storageclass", "local-disk",
                        "storageclass.kubernetes.io/is-default-class=true")
    except (StartupError, ApiError, OSError) as exc:
        cluster.stop()
        problem = f"the test cluster did not start: {exc}"
    if problem:
        pytest.fail(problem, pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def operator_running(cluster: TestCluster, identity: str, extra_args: Sequence[str] = (),
                     log_lines: int = 30) -> Iterator[OperatorProcess]:
    """One `localmodel run` replica; its log's tail is printed when it stops."""
    operator = OperatorProcess(cluster, identity=identity, extra_args=tuple(extra_args))
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        print(f"\n--- operator log tail:\n{operator.log_tail(log_lines)}")
