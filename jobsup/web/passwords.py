"""Password hashes: the standard library's scrypt (hashlib.scrypt, RFC 7914), a memory-hard scheme, so
the web extra needs no hashing package. A hash is `scrypt$N$r$p$salt$key`, salt and key in base64: the
cost travels with the hash, so a later release can raise it and still check the hashes made before."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from jobsup.errors import BadInput

# 2**15 x 8 x 1: 32 MiB and about 0.1 s per hash, beyond OWASP's minimum for scrypt (2**17 x 8 x 1
# asks 128 MiB per login attempt, which a small container would feel under a burst of attempts).
N, R, P = 2**15, 8, 1
KEY_BYTES = 32
SALT_BYTES = 16


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * n * r * p, dklen=KEY_BYTES)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str) -> str:
    """A new salted hash of `password`.

    >>> h = hash_password("s3cret"); h.startswith("scrypt$32768$8$1$"), verify("s3cret", h), verify("x", h)
    (True, True, False)
    """
    if not password:
        raise BadInput("an empty password is not a password")
    salt = secrets.token_bytes(SALT_BYTES)
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(_scrypt(password, salt, N, R, P))}"


def check_hash(text: str) -> str:
    """`text` if it is a hash this module makes, else BadInput (a plain password pasted by mistake)."""
    parts = text.split("$")
    try:
        ok = len(parts) == 6 and parts[0] == "scrypt" and all(int(x) > 0 for x in parts[1:4])
        ok = ok and len(_unb64(parts[4])) > 0 and len(_unb64(parts[5])) == KEY_BYTES
    except ValueError:
        ok = False
    if not ok:
        raise BadInput("not a password hash of `jobsup web --hash-password` (scrypt$N$r$p$salt$key)")
    return text


def verify(password: str, hashed: str) -> bool:
    """Whether `password` is the one `hashed` was made from (compared in constant time)."""
    try:
        _, n, r, p, salt, key = check_hash(hashed).split("$")
    except BadInput:
        return False
    return hmac.compare_digest(_scrypt(password, _unb64(salt), int(n), int(r), int(p)), _unb64(key))
