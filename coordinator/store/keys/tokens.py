"""Generating, hashing and comparing the store's secrets (API keys and node tokens).

Secrets are 32 random bytes from ``secrets.token_urlsafe``, so a single fast SHA-256 is the
right hash: nobody can brute-force 256 bits of entropy, and a slow password hash (bcrypt,
argon2) would only add latency to every request's hot path without adding safety. Only the hex
digest is ever stored; the plaintext is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

API_KEY_PREFIX = "gn_"
NODE_TOKEN_PREFIX = "gnn_"
# token_urlsafe(32) is 43 characters; anything much longer is not ours and is refused unhashed.
MAX_SECRET_LENGTH = 128


def new_api_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


def new_node_token() -> str:
    return NODE_TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    """Public identifier of an API key (safe to log, unlike the key)."""
    return "key_" + secrets.token_hex(8)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def digests_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("ascii"), b.encode("ascii"))


def looks_like(secret: str, prefix: str) -> bool:
    """Cheap shape check, so garbage never costs a database round trip."""
    return (
        isinstance(secret, str)
        and secret.startswith(prefix)
        and len(prefix) < len(secret) <= MAX_SECRET_LENGTH
    )
