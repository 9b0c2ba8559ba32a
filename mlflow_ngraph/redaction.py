"""Secrets out of every text the tool prints or records: the credentials of a URI (its
userinfo), the secret parameters of its query, and the ``password=`` of a connection string.

A tracking URI may carry a login (``http://alice:S3cret@host``, ``http://TOKEN@host``,
``postgresql://u:pw@db/m``, ``...?password=x``). MLflow, requests and SQLAlchemy repeat the
URI in their errors, so every message that can hold one (errors, log records, tracebacks)
goes through :func:`redact_text` before it is shown.
"""

from __future__ import annotations

import re

MASK = "***"

#: ``scheme://userinfo@``: the userinfo runs to the *last* ``@`` of the authority (a
#: password may hold an unescaped ``@``); the authority ends at ``/ ? #``, a blank or a quote
_USERINFO = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/?#\"<>`]*)@(?=[^\s@/?#\"<>`])"
)
#: one ``name=value`` of a query string (``?``, ``&`` or ``;`` before it)
_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[A-Za-z0-9_.\-\[\]%]+)=(?P<value>[^&#;\s'\"<>]*)")
#: the words of a query parameter's name that make its value a secret
_SECRET_WORDS = ("pass", "pwd", "token", "secret", "key", "credential", "signature")
_SECRET_NAMES = ("sig", "auth", "authorization")
#: a connection string's password (libpq's ``password=x``, ODBC's ``PWD=x``, escaped or not)
_KEYWORD = re.compile(
    r"(?P<name>(?:\b|(?<=%3[bB])|(?<=%26))(?:password|passwd|pwd))(?P<eq>\s*=\s*|%3[dD])"
    r"(?P<value>'[^']*'|\"[^\"]*\"|(?:(?!%3[bB])[^;&,\s'\"<>)\]}])+)",
    re.IGNORECASE,
)
#: an HTTP ``Authorization`` header's value (a client that prints its request's headers)
_AUTHORIZATION = re.compile(
    r"(?P<name>\bAuthorization['\"]?\s*[:=]\s*['\"]?)(?P<value>(?:[A-Za-z]+ )?[^\s'\",}]+)",
    re.IGNORECASE,
)


def _userinfo(match: re.Match) -> str:
    user, colon, password = match["userinfo"].partition(":")
    if colon and user and password:
        return f"{match['scheme']}{user}:{MASK}@"
    return f"{match['scheme']}{MASK}@"  # a token alone, or a name without a password


def secret_name(name: str) -> bool:
    """Whether a query parameter named ``name`` holds a secret (password, token, key...)."""
    lowered = name.lower()
    return lowered in _SECRET_NAMES or any(word in lowered for word in _SECRET_WORDS)


def _param(match: re.Match) -> str:
    if not secret_name(match["name"]) or not match["value"]:
        return match[0]
    return f"{match['lead']}{match['name']}={MASK}"


def redact_text(text: object) -> str:
    """``text`` with every secret a URI or connection string in it carries replaced by
    ``***``: the password of ``scheme://user:password@host`` (``user:***@``; a password
    holding ``@`` included), a userinfo that is a token alone (``***@``), the value of a
    query parameter named like a password, token, secret or key, a connection string's
    ``password=`` and an ``Authorization`` header. Anything else is left as it is."""
    out = _USERINFO.sub(_userinfo, str(text))
    out = _PARAM.sub(_param, out)
    out = _KEYWORD.sub(lambda m: f"{m['name']}{m['eq']}{MASK}", out)
    return _AUTHORIZATION.sub(lambda m: f"{m['name']}{MASK}", out)


def first_line(text: object, limit: int = 300) -> str:
    """The first non-blank line of ``text``, redacted and cut to ``limit`` characters."""
    lines = [line.strip() for line in redact_text(text).splitlines() if line.strip()]
    return lines[0][:limit] if lines else ""


def redact_log_records() -> None:
    """Every log record made in this process from now on carries its message, and its
    traceback, redacted, whichever logger made it and whichever handler prints it (MLflow's
    own included). Idempotent."""
    import logging

    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError, KeyError):  # logging reports a bad format at emit
            return record
        record.msg, record.args = redact_text(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return record

    factory.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
