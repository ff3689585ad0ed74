"""The ``mail_admins`` notifier (``zsched_notify_mail``): each notice or digest mails ADMINS.

It runs in the notifier's sender thread, so a slow mail server delays other
notices, never a task or beat. Django's own ``EMAIL_TIMEOUT`` bounds a send.
"""

from __future__ import annotations

import json

from django.conf import settings as django_settings
from django.core.mail import mail_admins

from celery_zsched.config import SETTING_PREFIX
from celery_zsched.core.errors import ConfigurationError
from celery_zsched.services.notices import Message

#: How many held notices a digest mail lists one by one.
DIGEST_LINES = 20


class AdminMail:
    """Sends each message with ``django.core.mail.mail_admins``."""

    name = "mail"

    def send(self, message: Message) -> None:
        """Mail ``message`` to ADMINS (``fail_silently=False``: failures are counted)."""
        mail_admins(f"[zsched] {message.title}", text_of(message), fail_silently=False)


def text_of(message: Message) -> str:
    """The plain-text body of a notice or digest mail."""
    body = message.body
    if message.event != "digest":
        lines = [f"{name}: {value}" for name, value in body.items() if value not in (None, "")]
        return "\n".join(lines) + "\n"
    lines = [message.title, ""]
    for notice in body["notices"][:DIGEST_LINES]:
        who = notice.get("name") or notice.get("url") or notice.get("job_id") \
            or notice.get("domain")
        lines.append(f"- {notice['event']}: {who}: {notice.get('error', '')}")
    more = body["count"] - min(len(body["notices"]), DIGEST_LINES)
    if more > 0:
        lines.append(f"... and {more} more")
    lines += ["", json.dumps({k: v for k, v in body.items() if k != "notices"}, indent=2)]
    return "\n".join(lines) + "\n"


def admin_mail() -> AdminMail:
    """The transport; raises :class:`ConfigurationError` when Django cannot mail."""
    if not django_settings.configured:
        raise ConfigurationError(
            f"{SETTING_PREFIX}notify_mail needs configured Django settings (ADMINS, "
            "EMAIL_BACKEND): set DJANGO_SETTINGS_MODULE in the worker and beat")
    return AdminMail()
