"""URLs shown without their credentials: the one place that decides what of a URL a
message, a log line, a page or a JSON document may show.

Ground rules:

- Any scheme (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
  ``postgresql://``, a broker's ``nats://`` or ``amqp://``) and a URL without one.
- The userinfo goes: ``user:***@`` when it is plainly a user and a password, ``***@``
  otherwise (a lone word may be a password).
- A query parameter whose name says it is a credential (:data:`SECRET_WORDS`, any case,
  percent-encoded or not) shows as ``name=***``; so does a query item without ``=`` (a
  password with an unencoded ``&`` would leave its tail as one).
- A malformed URL is shown as little as it takes: everything before its last ``@`` is
  the userinfo, whatever ``/``, ``?`` or ``#`` it holds (an unencoded one in a password
  must not leak its tail), and that userinfo shows as ``***``; when what comes before
  that ``@`` could be a query naming a credential, only the scheme is shown.
- :func:`hide_secrets` cleans a text that may quote a URL or a piece of it (a driver's
  exception): the URL shown as above, and every credential of it, and every long enough
  piece of one, replaced by ``***``.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["SECRET_WORDS", "hidden", "hide_secrets", "shown_url", "url_error"]

# A query parameter whose name (lower case) holds one of these is a credential.
SECRET_WORDS = (
    "pass",  # password, passwd, pass, sslpassword, sasl_password
    "pwd",
    "user",  # user, username
    "token",
    "auth",
    "secret",
    "key",  # api_key, sslkey
    "credential",
    "sasl",
)
MASK = "***"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)")
# A URL inside a text (a driver's message): a scheme, then up to white space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]*")
# A piece of a credential shorter than this is not searched for in a text.
_MIN_PIECE = 4


def _secret_key(name: str) -> bool:
    key = urllib.parse.unquote(name).lower()
    return any(word in key for word in SECRET_WORDS)


def _split(url: str) -> tuple[str, str | None, str]:
    """(scheme with ``://`` or "", the userinfo or None, the rest)."""
    found = _SCHEME.match(url)
    scheme = found.group(1) if found else ""
    rest = url[len(scheme) :]
    at = rest.rfind("@")
    if at < 0:
        return scheme, None, rest
    return scheme, rest[:at], rest[at + 1 :]


def _shown_userinfo(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    # A plain user name and a password; anything else (a lone word, a delimiter that
    # says the URL is malformed) may be all password.
    if colon and re.fullmatch(r"[\w.~%+-]*", user):
        return f"{user}:{MASK}"
    return MASK


def _shown_query(query: str) -> str:
    items = []
    for item in re.split(r"([&;])", query):
        if item in ("&", ";") or item == "":
            items.append(item)
            continue
        name, eq, _ = item.partition("=")
        items.append(MASK if not eq else f"{name}={MASK}" if _secret_key(name) else item)
    return "".join(items)


def shown_url(url: object) -> str:
    """``url`` without any credential, for a message; also when it is malformed.

    >>> shown_url("redis://:pw@127.0.0.1:6379/0")
    'redis://:***@127.0.0.1:6379/0'
    >>> shown_url("unix:///run/redis.sock?db=2&password=pw")
    'unix:///run/redis.sock?db=2&password=***'
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    scheme, userinfo, rest = _split(url)
    if userinfo is not None and "?" in userinfo:
        # Either a password with a "?" or a query with an "@": when that query names a
        # credential, its value may be what follows the "@".
        query = url[len(scheme) :].partition("?")[2]
        if any(_secret_key(item.partition("=")[0]) for item in re.split(r"[&;]", query)):
            return scheme + MASK
    shown = scheme + (_shown_userinfo(userinfo) + "@" if userinfo is not None else "")
    base, question, query = rest.partition("?")
    if question:
        return shown + base + "?" + _shown_query(query)
    return shown + rest


def _secrets_of(url: str, shortest: int = _MIN_PIECE) -> list[str]:
    """The credentials of ``url`` (raw and decoded), and their pieces between
    delimiters of at least ``shortest`` characters, longest first."""
    _, userinfo, rest = _split(url)
    found: list[str] = []
    if userinfo is not None:
        password = userinfo.partition(":")[2]
        found.append(userinfo if _shown_userinfo(userinfo) == MASK else password)
    query = rest.partition("?")[2]
    for item in re.split(r"[&;]", query):
        name, eq, value = item.partition("=")
        if not eq:
            found.append(name)
        elif _secret_key(name):
            found.append(value)
    out: set[str] = set()
    for secret in found:
        for form in (secret, urllib.parse.unquote(secret)):
            out.add(form)
            out.update(re.split(r"[/?#@&:;]", form))
    return sorted((s for s in out if len(s) >= shortest), key=len, reverse=True)


def _shown_in_text(found: re.Match[str]) -> str:
    url = found.group(0)
    tail = len(url) - len(url.rstrip(".,:;)]"))  # the sentence's, not the URL's
    return shown_url(url[: len(url) - tail]) + url[len(url) - tail :]


def hide_secrets(text: str, *urls: str | None) -> str:
    """``text`` (a message that may quote ``urls`` or pieces of them) without their
    credentials: each URL shown by :func:`shown_url`, any other URL in it too, and every
    credential of them, or a piece of one, replaced by ``***``."""
    text = str(text)
    given = [u for u in urls if isinstance(u, str) and u]
    for url in sorted(given, key=len, reverse=True):
        text = text.replace(url, shown_url(url))
    text = _URL_IN_TEXT.sub(_shown_in_text, text)
    for url in given:
        for secret in _secrets_of(url):
            text = text.replace(secret, MASK)
    return text


def url_error(message: str, url: str) -> str:
    """The message of an error about a malformed ``url`` (a parser's, which may quote a
    piece of it), without its credentials. When a piece of one, however short, is still
    in it, the message says only what to check."""
    text = hide_secrets(message, url)
    if any(piece in text for piece in _secrets_of(url, shortest=2)):
        return (
            f"malformed URL {shown_url(url)}: check its credentials "
            "(percent-encode / ? # @ : & in them as %2F %3F %23 %40 %3A %26)"
        )
    return text


def hidden(exc: BaseException, *urls: str | None) -> BaseException:
    """``exc`` itself when its message shows no credential of ``urls``; else an
    exception of its type (a ValueError when that cannot be made) whose message is
    cleaned by :func:`hide_secrets` (raise it ``from None``: the original would show
    the secret in a traceback)."""
    message = str(exc)
    clean = hide_secrets(message, *urls)
    if isinstance(exc, ValueError | TypeError):
        clean = url_error(clean, *[u for u in urls if u][:1]) if any(urls) else clean
    if clean == message:
        return exc
    try:
        return type(exc)(clean)
    except Exception:  # an exception type with another signature
        return ValueError(clean)
