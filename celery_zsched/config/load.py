"""How settings are read: prefixes, coercion of raw values, and what logs may show."""

from __future__ import annotations

import dataclasses
from typing import Any

from celery_zsched.core.errors import ConfigurationError

SETTING_PREFIX = "zsched_"
ENV_PREFIX = "ZSCHED_"
#: Settings an integration owns and validates (celery_zsched.contrib.django reads
#: these): beat accepts them in a shared CELERY_ZSCHED_* namespace and leaves
#: them alone, so a Django project's settings never fail beat's check.
INTEGRATION_SETTINGS = frozenset({"history_days", "redis_alias", "outbox_interval_s",
                                  "outbox_backoff_max_s", "outbox_max_attempts",
                                  "outbox_warn_s"})

#: What a setting of each type must be, in words ("an integer", not "a int").
_KIND_WORDS: dict[type[Any], str] = {bool: "true or false", str: "a string",
                                     int: "an integer", float: "a number"}


def check_positive(settings: Any, *names: str) -> None:
    """:class:`ConfigurationError` naming the first of ``names`` that is not > 0."""
    for name in names:
        if getattr(settings, name) <= 0:
            raise ConfigurationError(
                f"{SETTING_PREFIX}{name} must be > 0, got {getattr(settings, name)!r}")


def check_not_negative(settings: Any, *names: str) -> None:
    """:class:`ConfigurationError` naming the first of ``names`` that is < 0."""
    for name in names:
        if getattr(settings, name) < 0:
            raise ConfigurationError(
                f"{SETTING_PREFIX}{name} must be >= 0, got {getattr(settings, name)!r}")


def coerce(f: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    """``raw`` as the type of field ``f``; :class:`ConfigurationError` naming ``source``."""
    kind: type[Any] = type(f.default)
    try:
        if kind is bool:
            return _as_bool(raw)
        if kind is str:
            # A list of names (zsched_notify_events) may be given as a list.
            return ",".join(map(str, raw)) if isinstance(raw, list | tuple) else str(raw)
        if kind is int and not isinstance(raw, bool):
            return int(raw)
        if kind is float and not isinstance(raw, bool):
            return float(raw)
    except (TypeError, ValueError):
        pass
    raise ConfigurationError(f"{source} must be {_KIND_WORDS.get(kind, kind.__name__)}, "
                             f"got {raw!r}")


def _as_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(text)


def cert_reqs_name(value: Any) -> str:
    """``ssl.CERT_REQUIRED`` (or its name, or redis-py's) as redis-py's ``required``."""
    import ssl

    if isinstance(value, int):  # ssl.VerifyMode is an IntEnum
        names = {int(ssl.CERT_NONE): "none", int(ssl.CERT_OPTIONAL): "optional",
                 int(ssl.CERT_REQUIRED): "required"}
        return names.get(int(value), str(value))
    text = str(value).strip().lower()
    return text[len("cert_"):] if text.startswith("cert_") else text


def redact_url(url: str) -> str:
    """``url`` with its credentials masked, for logs and banners.

    The last ``@`` ends the credentials: a password may contain ``@`` itself.
    """
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url
