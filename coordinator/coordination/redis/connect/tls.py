"""TLS to Redis (``rediss://``) verified against a private CA (``GEMMANET_REDIS_CA_FILE``).

Without a CA file a ``rediss://`` URL keeps coredis's own handling of its ``ssl_*`` query
parameters. With one, this module builds the context instead: the server certificate must chain
to that CA *and* name the host of the URL (``check_hostname``); optionally a client certificate
and key for servers that require mutual TLS (``tls-auth-clients yes``).
"""

from __future__ import annotations

import ssl

from coordinator.errors import SettingsError

__all__ = ["private_ca_context"]


def private_ca_context(
    ca_file: str, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A client context trusting only ``ca_file``; a file that is not PEM is refused in one
    line (SettingsError) naming the setting."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED + check_hostname
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(
            f"GEMMANET_REDIS_CA_FILE={ca_file!r}: not a readable PEM CA certificate "
            f"({getattr(exc, 'strerror', None) or exc})"
        ) from None
    if cert_file and key_file:
        try:
            context.load_cert_chain(certfile=cert_file, keyfile=key_file)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(
                "GEMMANET_REDIS_CERT_FILE/GEMMANET_REDIS_KEY_FILE: not a matching PEM "
                f"certificate and key ({getattr(exc, 'strerror', None) or exc})"
            ) from None
    return context
