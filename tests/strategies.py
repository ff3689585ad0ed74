"""Hypothesis strategies of job rows: plausible values, their edges, and plain garbage.

Shared by ``test_bad_input_fuzz.py`` (the parser, the importer) and
``django/test_dj_bad_input_fuzz.py`` (the model, its form). Every field draws
from values that should validate (so later checks are reached too), values
just past each limit, and values of any type, size and shape: wrong types,
NaN and infinities, huge integers, nesting past the recursion limit, long
strings, lone surrogates, NUL, directory-like zone names, broken URLs.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from celery_zsched.core.job import Job, id_problem

#: The core fields of a job (``id``, ``task``, ``url`` ... ``day_rule``).
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Job))

# Bounded runs: the suite stays fast on a shared 2-core machine. Raise the
# count with ZSCHED_FUZZ_EXAMPLES=5000 for a longer hunt.
EXAMPLES = int(os.environ.get("ZSCHED_FUZZ_EXAMPLES", "300"))
settings.register_profile(
    "zsched-fuzz", max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.large_base_example, HealthCheck.function_scoped_fixture])
FUZZ = settings.get_profile("zsched-fuzz")
#: Whole files cost more per example: fewer of them.
FUZZ_FILES = settings(FUZZ, max_examples=max(EXAMPLES * 2 // 3, 1))


def nested(depth: int, leaf: Any = None) -> Any:
    """``[[...[leaf]...]]`` ``depth`` levels deep, built without recursion."""
    value: Any = [] if leaf is None else leaf
    for _ in range(depth):
        value = [value]
    return value


# Built by .map: Hypothesis repr()s sampled_from's elements, and repr() of an
# int over 4300 digits raises.
HUGE_INTS = st.one_of(
    st.sampled_from([10**400, -(10**400), 2**31, 2**31 - 1, 2**63, 2**64, -1, 0,
                     253_402_300_800, 3_155_760_001]),
    st.integers(4301, 6000).map(lambda digits: 10**digits))
INTS = st.one_of(st.integers(), HUGE_INTS)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([1e308, -1e308, 1e-300, 5e-324, 0.0005, 3155760000.5]))
# Every code point, lone surrogates and NUL included.
ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, categories=None)
EDGE_TEXT = st.sampled_from([
    "", " ", "\x00", "\ud800", "a\udcff", "\udbff\udfff", "\u2028", "é", "😀", "\t\n",
    "NaN", "Infinity", "-inf", "1e400", "-1", "0", "true", "maybe", "null", "[]", "{}",
    "[" * 5000, "{\"a\":" * 5000, "9" * 5000, "Europe", "Europe/Berlin", "UTC",
])
LONG_TEXT = st.integers(0, 300_000).map(lambda n: "x" * n)  # cheap, however long
TEXT = st.one_of(st.text(ANY_CHAR, max_size=30), EDGE_TEXT, LONG_TEXT)

JSON_LEAF = st.one_of(st.none(), st.booleans(), INTS, FLOATS, st.text(ANY_CHAR, max_size=10))
JSON_KEY = st.one_of(st.text(ANY_CHAR, max_size=8), INTS, st.none(), st.booleans())
JSON_LIKE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(JSON_KEY, inner, max_size=4)),
    max_leaves=12)
DEEP = st.integers(1, 3000).map(nested)  # past 32 levels, and past the recursion limit
BIG = st.sampled_from(["strings", "items", "blob"]).map(lambda kind: {
    "strings": ["x" * 600_000, "y" * 600_000], "items": list(range(300_000)),
    "blob": {"blob": "z" * 1_100_000}}[kind])
ODD = st.sampled_from([object(), b"bytes", {1, 2}, (1, 2), timedelta(seconds=5), 1j])

#: Anything at all: the value of a field that expects something else.
ANY = st.one_of(JSON_LIKE, DEEP, TEXT, INTS, FLOATS, ODD, BIG,
                st.datetimes(timezones=st.none() | st.timezones()))

ZONES = st.one_of(st.timezone_keys(), st.sampled_from([
    "Europe", "America", "America/Argentina", "Etc", "right", "posix", "Europe/", "/Europe",
    "../../etc/passwd", "/etc/passwd", "Europe/Berlin/", "Europe//Berlin", "Europe/../UTC",
    "x" * 300, "Europe/" + "y" * 5000, "zone.tab", "tzdata.zi", "leapseconds", "localtime",
    "EUROPE/BERLIN", "Europe\x00Berlin", "Europe/\ud800",
]))
URLS = st.one_of(st.sampled_from([
    "https://example.com/a", "http://127.0.0.1:8000/x?y=1", "https://[::1]:8080/",
    "http://[::1", "https://[fe80::1/x", "http://a]/", "http://[::1]:99999/", "http://a:-1/",
    "http://a:99999999/", "ftp://example.com/", "https://", "https:///path", "http://a b/",
    "http://a/\n", "http://a/\t", "https://example.com/\udcff", "http://a/\x00", "//example.com",
    "https://user@/", "HTTP://EXAMPLE.COM/", "https://example.com/" + "p" * 3000,
]), st.builds("https://{}/{}".format, st.text(ANY_CHAR, max_size=12),
              st.text(ANY_CHAR, max_size=12)))
CRONS = st.sampled_from([
    "* * * * *", "*/15 * * * *", "0 9 * * 1-5", "0 0 31 2 *", "0 0 30 4 1", "61 * * * *",
    "*/0 * * * *", "L * * * *", "0 9 * *", "0 9 * * * *", "@hourly", "0 9 * * MON",
    "0 9 * * 1" + ",1" * 100, "0\t9  * * *", " 0 9 * * * ",
])
TIMES = st.one_of(
    st.datetimes(timezones=st.none() | st.timezones()),
    st.datetimes().map(lambda d: d.isoformat()),
    st.datetimes(timezones=st.just(timezone.utc)).map(lambda d: d.isoformat().replace(
        "+00:00", "Z")),
    st.sampled_from(["0001-01-01T00:00:00", "9999-12-31T23:59:59Z", "9999-12-31T23:00-05:00",
                     "1969-12-31T23:59:59Z", "1970-01-01T00:00:00Z", "2030-01-01T09:00:00",
                     "2030-02-30T00:00:00", "yesterday", "2030-01-01T00:00:00\ud800"]),
    st.floats(min_value=-1e20, max_value=1e20), INTS, FLOATS)
SECONDS = st.one_of(st.floats(0, 1e6), st.integers(0, 10**6), FLOATS, INTS,
                    st.sampled_from(["30", "0.5", "1e400", "nan", "", " 7 ", "1_000"]))
COUNTS = st.one_of(st.integers(-5, 300), INTS, FLOATS,
                   st.sampled_from(["3", "3.0", " 4 ", "9" * 5000, "x", "1e3"]))
CONTAINERS = st.one_of(JSON_LIKE, DEEP, BIG,
                       JSON_LIKE.map(lambda v: _json_text(v)), st.just("[" * 50_000))


def _json_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        return "{not json"


#: A strategy per core field: mostly that field's kind of value, sometimes anything.
PER_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "id": st.one_of(st.from_regex(r"[A-Za-z0-9_.:@/-]{1,20}", fullmatch=True), TEXT),
    "task": st.one_of(st.sampled_from(["tasks.scrape", "t"]), TEXT),
    "url": URLS,
    "name": TEXT, "queue": TEXT, "routing_key": TEXT,
    "interval_s": SECONDS, "jitter_s": SECONDS, "expires_s": SECONDS,
    "misfire_grace_s": SECONDS, "retry_base_s": SECONDS,
    "cron": st.one_of(CRONS, TEXT), "timezone": ZONES,
    "day_rule": st.one_of(st.sampled_from(["or", "and", "AND", " or ", "xor"]), TEXT),
    "run_at": TIMES, "start_at": TIMES, "end_at": TIMES,
    "meta": CONTAINERS, "args": CONTAINERS, "kwargs": CONTAINERS,
    "priority": COUNTS, "max_runs": COUNTS, "retry_max": COUNTS,
    "enabled": st.one_of(st.booleans(), st.sampled_from(["yes", "off", "", "2"]), INTS),
}
#: Fields this strategy does not know (added since) still get anything.
FIELD_VALUES = {name: st.one_of(PER_FIELD.get(name, ANY), ANY) for name in FIELDS}

# Values that should validate, so that a row with one or two bad fields gets
# past every other check and each check is reached on its own.
_PLAIN = st.characters(exclude_categories=("Cs", "Cc"))
_SAFE_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53),
              st.floats(allow_nan=False, allow_infinity=False), st.text(_PLAIN, max_size=10)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(_PLAIN, max_size=5),
                                                                  inner, max_size=3),
    max_leaves=8)
_GOOD_TIME = st.one_of(
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9998, 1, 1),
                 timezones=st.none() | st.just(timezone.utc)),
    st.floats(0, 253_000_000_000).map(lambda s: round(s, 3)))
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "name": st.text(_PLAIN, max_size=40), "queue": st.text(_PLAIN, max_size=20),
    "routing_key": st.text(_PLAIN, max_size=20), "jitter_s": st.floats(0, 3600),
    "expires_s": st.floats(0.001, 86400), "misfire_grace_s": st.floats(0, 3600),
    "retry_base_s": st.floats(0.001, 600), "priority": st.integers(0, 255),
    "max_runs": st.integers(1, 10**6), "retry_max": st.integers(0, 1000),
    "enabled": st.booleans(), "start_at": _GOOD_TIME, "end_at": _GOOD_TIME,
    "meta": st.dictionaries(st.text(_PLAIN, max_size=5), _SAFE_JSON, max_size=3),
    "args": st.lists(_SAFE_JSON, max_size=3),
    "kwargs": st.dictionaries(st.text(_PLAIN, max_size=5), _SAFE_JSON, max_size=3),
}
_IDENTITY = st.one_of(
    st.builds(lambda i, t: {"id": i, "task": t},
              # Valid ids: no segment a URL path would rewrite (".", "..", "", a last
              # "executions"); PER_FIELD's ids may be anything.
              st.from_regex(r"[A-Za-z0-9_.:@/-]{1,30}", fullmatch=True).filter(
                  lambda i: id_problem(i) is None),
              st.sampled_from(["tasks.scrape", "t"])),
    st.builds(lambda host, path: {"url": f"https://{host}/{path}"},
              st.sampled_from(["example.com", "127.0.0.1:8000", "[::1]:8080", "xn--bcher-kva.ch"]),
              st.text("abcxyz0123-_/%?=&é", max_size=20)),
)
_TIMING = st.one_of(
    st.just({}),
    st.builds(lambda s: {"interval_s": s}, st.floats(0.001, 3e9) | st.integers(1, 10**6)),
    st.builds(lambda c, z, r: {"cron": c, "timezone": z, "day_rule": r},
              st.sampled_from(["* * * * *", "*/15 * * * *", "0 9 * * 1-5", "30 2 * * *",
                               "0 0 29 2 *", "0 0 13 * 5"]),
              st.timezone_keys(), st.sampled_from(["or", "and"])),
    st.builds(lambda t: {"run_at": t}, _GOOD_TIME),
)
#: One or two fields with a bad (or any) value.
_BAD = st.lists(st.sampled_from(FIELDS), max_size=2, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({name: FIELD_VALUES[name] for name in names}))

#: A definition as a mapping: a valid job, with one or two of its fields (and
#: now and then an unknown key) replaced by anything.
ROWS: st.SearchStrategy[dict[Any, Any]] = st.builds(
    lambda identity, timing, good, bad, extra: {**identity, **timing, **good, **bad, **extra},
    _IDENTITY, _TIMING, st.fixed_dictionaries({}, optional=GOOD), _BAD,
    st.one_of(st.just({}), st.just({}), st.just({}),
              st.dictionaries(st.one_of(st.text(max_size=8), INTS), ANY, max_size=1)),
)


def _as_json(row: dict[str, Any]) -> dict[str, Any]:
    return {name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in row.items()}


#: A valid definition as a JSON body (times as ISO 8601 text): what an API client sends.
#: end_at is left out: drawn apart, it may fall before start_at.
VALID_JSON_ROWS: st.SearchStrategy[dict[str, Any]] = st.builds(
    lambda identity, timing, good: _as_json({**identity, **timing, **good}),
    _IDENTITY, _TIMING,
    st.fixed_dictionaries({}, optional={k: v for k, v in GOOD.items() if k != "end_at"}))
