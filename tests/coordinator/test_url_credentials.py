"""Credentials in GEMMANET_REDIS_URL and GEMMANET_DATABASE_URL: refused at start in one line
that names the setting and where the secret goes instead, never echoing it; hidden wherever a
URL is shown (the audit report, store and Redis messages)."""

from __future__ import annotations

import pytest

from coordinator.audit.findings import Observed, judge
from coordinator.audit.render import render_text
from coordinator.coordination.redis.connect.errors import redact_url
from coordinator.errors import SettingsError
from coordinator.settings import Settings
from coordinator.store.engine import normalize_url, safe_url
from coordinator.url_credentials import credentials_in, hide_credentials

SECRET = "PLANTED-s3cret-9"


@pytest.mark.parametrize(
    ("variable", "url", "named", "how"),
    [
        ("GEMMANET_REDIS_URL", f"redis://h:6379/0?password={SECRET}", "'password'", "PASSWORD_FILE"),
        ("GEMMANET_REDIS_URL", f"redis://me:{SECRET}@h:6379/0", "after the user", "PASSWORD_FILE"),
        ("GEMMANET_REDIS_URL", f"rediss://h/0?ssl_ca_certs=/ca&token={SECRET}", "'token'", "FILE"),
        ("GEMMANET_REDIS_URL", f"redis+cluster://h:7000?auth_token={SECRET}", "'auth_token'", "FILE"),
        ("GEMMANET_REDIS_URL", f"redis+sentinel://me:{SECRET}@a:1,b:2/svc", "after the user", "FILE"),
        ("GEMMANET_REDIS_URL", f"redis+sentinel://a:1,b:2/svc?password={SECRET}", "'password'", "FILE"),
        ("GEMMANET_DATABASE_URL", f"postgresql://gn:{SECRET}@db/gn", "after the user", "PGPASSFILE"),
        ("GEMMANET_DATABASE_URL", f"postgresql://gn@db/gn?password={SECRET}", "'password'", ".pgpass"),
        ("GEMMANET_DATABASE_URL", f"postgresql://gn@db/gn?sslpassword={SECRET}", "'sslpassword'", "PGPASSWORD"),
    ],
)  # fmt: skip
def test_a_credential_in_a_url_is_refused_without_echoing_it(
    variable: str, url: str, named: str, how: str
) -> None:
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({variable: url})
    message = str(refused.value)
    assert message.startswith(f"{variable} must not carry credentials"), message
    assert named in message and how in message, message
    assert SECRET not in message and "\n" not in message


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("GEMMANET_REDIS_URL", "redis://gemmanet-a@h:6379/0"),  # an ACL user name is no secret
        ("GEMMANET_REDIS_URL", "rediss://h:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_cert_reqs=none"),
        ("GEMMANET_REDIS_URL", "redis+sentinel://me@a:1,b:2,c:3/svc?ssl_cert_reqs=none"),
        ("GEMMANET_DATABASE_URL", "postgresql://gn@db/gn?passfile=/etc/gn.pgpass&connect_timeout=2"),
        ("GEMMANET_DATABASE_URL", "sqlite:///./gemmanet.db"),
    ],
)  # fmt: skip
def test_urls_without_credentials_pass(variable: str, url: str) -> None:
    Settings.from_env({variable: url})
    assert credentials_in(url) == []
    assert hide_credentials(url) == url


def test_every_shown_url_hides_the_password_and_secret_parameters() -> None:
    url = f"redis://me:{SECRET}@h:6379/0?ssl_cert_reqs=none&password={SECRET}"
    for shown in (
        hide_credentials(url),
        redact_url(url),
        safe_url(normalize_url(f"postgresql://gn:{SECRET}@db/gn?sslpassword={SECRET}&x=1")),
    ):
        assert SECRET not in shown and "***" in shown, shown
    assert hide_credentials(url) == "redis://me:***@h:6379/0?ssl_cert_reqs=none&password=***"


def test_the_audit_report_never_shows_a_urls_credentials() -> None:
    # Settings made directly, past the refusal at start: the report still hides them.
    settings = Settings(redis_url=f"redis://me:{SECRET}@h:6379/0?token={SECRET}")
    document = judge(settings, Observed(redis_error="connection refused")).document
    assert document["redis"]["url"] == "redis://me:***@h:6379/0?token=***"
    assert SECRET not in render_text(document) and SECRET not in repr(document)
