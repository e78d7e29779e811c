"""`localmodel run` flags and their environment variables (controller/config.py)."""

from __future__ import annotations

import pytest

from localmodel.controller.config import ConfigError, parse_config

pytestmark = pytest.mark.unit


def test_defaults_flags_and_environment() -> None:
    c = parse_config([], {})
    assert c.kubeconfig is None and c.namespaces == () and c.log_format == "text"
    assert c.leader_namespace == "localmodel-system"
    env = {"KUBECONFIG": "/k", "POD_NAMESPACE": "ops", "LOCALMODEL_LOG_FORMAT": "json",
           "LOCALMODEL_NAMESPACE": "ai, batch", "LOCALMODEL_METRICS_LISTEN": "off"}
    c = parse_config([], env)
    assert (c.kubeconfig, c.leader_namespace, c.log_format) == ("/k", "ops", "json")
    assert c.namespaces == ("ai", "batch") and c.metrics_listen is None
    c = parse_config(["--kubeconfig", "/x", "--namespace", "a", "--namespace", "b",
                      "--log-format", "text", "--health-listen", "127.0.0.1:9"], env)
    assert (c.kubeconfig, c.namespaces, c.log_format) == ("/x", ("a", "b"), "text")
    assert c.health_listen == ("127.0.0.1", 9)


def test_http_downloads_are_off_unless_said_true() -> None:
    assert parse_config([], {}).allow_http_downloads is False
    assert parse_config(["--allow-http-downloads=true"], {}).allow_http_downloads is True
    assert parse_config([], {"LOCALMODEL_ALLOW_HTTP_DOWNLOADS": "true"}).allow_http_downloads
    assert not parse_config(["--allow-http-downloads=false"],
                            {"LOCALMODEL_ALLOW_HTTP_DOWNLOADS": "true"}).allow_http_downloads


@pytest.mark.parametrize(("argv", "env", "flag"), [
    (["--metrics-listen", "host:notaport"], {}, "metrics-listen"),
    (["--health-listen", "70000"], {}, "health-listen"),
    ([], {"LOCALMODEL_LOG_FORMAT": "xml"}, "log-format"),
    (["--lease-seconds", "0"], {}, "lease-seconds"),
    (["--allow-http-downloads", "yes"], {}, "allow-http-downloads"),
    ([], {"LOCALMODEL_ALLOW_HTTP_DOWNLOADS": "1"}, "allow-http-downloads"),
    (["--router-url", "localmodel-router:80"], {}, "router-url"),
    ([], {"LOCALMODEL_ROUTER_URL": "ftp://router"}, "router-url"),
    (["--yield-grace", "0"], {}, "yield-grace"),
    (["--yield-grace", "soon"], {}, "yield-grace"),
    ([], {"LOCALMODEL_RESERVE_SECONDS": "-5"}, "reserve-seconds"),
    (["--reserve-seconds", "inf"], {}, "reserve-seconds"),
])
def test_bad_values_name_the_flag(argv: list[str], env: dict[str, str], flag: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(argv, env)
    assert exc.value.flag == flag and f"--{flag}" in str(exc.value)


def test_the_idle_settings_come_from_their_flags_and_the_router_namespace() -> None:
    """--yield-grace and --reserve-seconds feed the idle decisions' settings
    (idle/asks.py IdleSettings); a router runs when it has a namespace."""
    c = parse_config([], {})
    assert (c.router_url, c.yield_grace, c.reserve_seconds) == ("", 30.0, 120.0)
    assert (c.idle_settings.grace_s, c.idle_settings.reserve_s) == (30.0, 120.0)
    assert c.idle_settings.router is False
    c = parse_config(["--yield-grace", "45", "--router-namespace", "lm",
                      "--router-url", "http://localmodel-router.lm:80/"],
                     {"LOCALMODEL_RESERVE_SECONDS": "300", "LOCALMODEL_YIELD_GRACE": "5"})
    assert (c.idle_settings.grace_s, c.idle_settings.reserve_s) == (45.0, 300.0)
    assert c.idle_settings.router is True
    assert c.router_url == "http://localmodel-router.lm:80"  # no trailing slash
    # ...and the doorman's render reads it (controller/changes.py doorman_changes).
    from localmodel.controller.reconcile import render_options
    assert render_options(c).router_url == c.router_url
    assert render_options(parse_config([], {})).router_url == ""


def test_lease_renewal_is_well_inside_the_lease() -> None:
    c = parse_config(["--lease-seconds", "12"], {})
    assert c.renew_seconds * 3 <= c.lease_seconds


def test_credentials_from_a_kubeconfig_carry_the_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from localmodel.kube import credentials

    ca = tmp_path / "ca.crt"
    ca.write_text("")
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://10.0.0.1:6443/', "
        f"certificate-authority: {ca}}}}}]\n"
        "users: [{name: u, user: {token: abc123}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n")
    creds = credentials(str(kc))
    assert (creds.server, creds.bearer(), creds.ca_file) == ("https://10.0.0.1:6443", "abc123",
                                                             str(ca))


async def test_trigger_later_fires_again_after_an_earlier_timer_fired() -> None:
    """A retry timer that already fired must not swallow the next one."""
    import asyncio

    from localmodel.controller.config import OperatorConfig
    from localmodel.controller.operator_metrics import OperatorMetrics
    from localmodel.controller.reconcile import Reconciler

    r = Reconciler(OperatorConfig(), None, OperatorMetrics())  # type: ignore[arg-type]
    for _ in range(2):
        r._wake.clear()
        r.trigger_later(0.05)
        await asyncio.wait_for(r._wake.wait(), timeout=2)
    r._wake.clear()
    r.trigger_later(5)
    r.trigger_later(0.05)  # an earlier wake-up replaces a later one
    await asyncio.wait_for(r._wake.wait(), timeout=2)
