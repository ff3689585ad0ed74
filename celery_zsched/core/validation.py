"""Validating a whole job definition: every field checked, the timing and identity
consistent, the containers storable as strict JSON."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from typing import Any
from zoneinfo import ZoneInfo

from celery_zsched.core import fields as check
from celery_zsched.core.domains import normalise_domain
from celery_zsched.core.errors import ValidationError, show_value
from celery_zsched.core.fields import (
    MAX_DEPTH,
    MAX_JSON_CHARS,
    MAX_LEN,
    NUL_ESCAPE,
    RECRAWL_MODES,
    SURROGATE,
    TIME_FIELDS,
    TRANSPORTS,
)
from celery_zsched.core.policy import Defaults
from celery_zsched.core.timing import (
    DAY_RULES,
    cron_problem,
)


def parse_fields(data: Mapping[str, Any], defaults: Defaults, known: frozenset[str]
                 ) -> dict[str, Any]:
    """The validated, normalised fields of definition ``data`` (what a Job is built
    from); :class:`ValidationError` naming the first bad field. ``known``: the
    field names a definition may have."""
    if not isinstance(data, Mapping):
        raise ValidationError("row", data, "must be a JSON object")
    for key in data:
        if key not in known:
            raise ValidationError(_field_name(key), data[key], "unknown field")
    values: dict[str, Any] = {k: v for k, v in data.items() if v is not None and v != ""}

    url = values.get("url")
    if url is not None:
        url = check.url(url)
    tz_name = check.timezone(values.get("timezone", defaults.timezone))
    tz = ZoneInfo(tz_name)

    job_id, task = _identity(values, url, defaults)
    day_rule = _day_rule(values)
    interval, cron = _timing(values, defaults, day_rule)
    times = {name: check.time_field(values, name, tz) for name in TIME_FIELDS}
    if times["start_at"] and times["end_at"] and times["end_at"] <= times["start_at"]:
        raise ValidationError("end_at", values["end_at"], "must be after start_at")

    fields = dict(
        id=job_id, task=task, interval_s=interval, cron=cron, timezone=tz_name,
        day_rule=day_rule if cron else "or",
        run_at=times["run_at"], name=check.text(values, "name"), url=url,
        meta=check.container(values, "meta", dict),
        args=check.container(values, "args", list),
        kwargs=check.container(values, "kwargs", dict),
        jitter_s=check.number(values, "jitter_s", minimum=0.0),
        queue=check.opt_text(values, "queue"), routing_key=check.opt_text(values, "routing_key"),
        priority=check.integer(values, "priority", 0, 255),
        expires_s=check.number(values, "expires_s", minimum=0.001),
        enabled=check.boolean(values, "enabled"),
        start_at=times["start_at"], end_at=times["end_at"],
        max_runs=check.integer(values, "max_runs", 1, None),
        misfire_grace_s=check.number(values, "misfire_grace_s", minimum=0.0),
        retry_max=check.integer(values, "retry_max", 0, 1000),
        retry_base_s=check.number(values, "retry_base_s", minimum=0.001),
        domain=_domain(values),
        transport=_transport(values),
        **_recrawl(values, interval, cron),
    )
    _check_serialisable(fields)
    return fields


def _recrawl(values: Mapping[str, Any], interval: float | None,
             cron: str | None) -> dict[str, Any]:
    raw = values.get("recrawl", "fixed")
    mode = raw.strip().lower() if isinstance(raw, str) else raw
    if mode not in RECRAWL_MODES:
        raise ValidationError("recrawl", raw,
                              'must be "fixed" (every interval_s) or "adaptive" (follows the '
                              "page's change rate)")
    if mode == "adaptive" and interval is None:
        kind = "a cron job keeps its slots" if cron else "a one-off job runs once"
        raise ValidationError("recrawl", raw, f"adaptive needs an interval job ({kind})")
    low = check.number(values, "min_interval_s", minimum=0.001)
    high = check.number(values, "max_interval_s", minimum=0.001)
    if low is not None and high is not None and high < low:
        raise ValidationError("max_interval_s", values["max_interval_s"],
                              f"must be at least min_interval_s ({low:g})")
    target = values.get("freshness_target")
    if target is not None:
        target = check.number(values, "freshness_target", minimum=0.0)
        if target is None or not 0 < target < 1:
            raise ValidationError("freshness_target", values["freshness_target"],
                                  "must be a share between 0 and 1 (exclusive), e.g. 0.9")
    return {"recrawl": str(mode), "min_interval_s": low, "max_interval_s": high,
            "freshness_target": target}


def _transport(values: Mapping[str, Any]) -> str:
    raw = values.get("transport", "celery")
    value = raw.strip().lower() if isinstance(raw, str) else raw
    if value not in TRANSPORTS:
        raise ValidationError("transport", raw,
                              'must be "celery" (beat publishes it) or "http" (the job gateway)')
    return str(value)


def _domain(values: Mapping[str, Any]) -> str | None:
    value = values.get("domain")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError("domain", value, "must be a string")
    try:
        return normalise_domain(value)
    except ValueError as exc:
        raise ValidationError("domain", value, str(exc)) from None


def _field_name(key: Any) -> str:
    # str() of a key can raise (an int over 4300 digits) or be megabytes long;
    # an empty or unprintable one (a newline, a lone surrogate) is quoted.
    if isinstance(key, str) and key.isprintable() and key.strip():
        return key[:100]
    return show_value(key)


def _identity(values: Mapping[str, Any], url: str | None,
              defaults: Defaults) -> tuple[str, str]:
    job_id = values.get("id")
    if job_id is None:
        if url is None:
            raise ValidationError("id", None, "a job without a url needs an explicit id")
        job_id = check.job_id_for_url(url)
    problem = check.id_problem(job_id)
    if problem:
        raise ValidationError("id", job_id, problem)
    task = values.get("task", defaults.task if url is not None else None)
    if not isinstance(task, str) or not task.strip():
        raise ValidationError("task", task, "a job without a url needs a task name")
    problem = check.text_problem(task.strip(), MAX_LEN["task"])
    if problem:
        raise ValidationError("task", task, problem)
    return job_id, task.strip()


def _day_rule(values: Mapping[str, Any]) -> str:
    raw = values.get("day_rule", "or")
    rule = raw.strip().lower() if isinstance(raw, str) else raw
    if rule not in DAY_RULES:
        raise ValidationError("day_rule", raw,
                              'must be "or" (crontab(5)) or "and" (Celery crontab)')
    return str(rule)


def _timing(values: Mapping[str, Any], defaults: Defaults,
            day_rule: str = "or") -> tuple[float | None, str | None]:
    timing = [k for k in ("interval_s", "cron", "run_at") if k in values]
    if len(timing) > 1:
        raise ValidationError(timing[1], values[timing[1]],
                              f"give only one of interval_s, cron, run_at (also got {timing[0]})")
    if not timing:
        return defaults.interval_s, None
    if timing == ["interval_s"]:
        return check.number(values, "interval_s", minimum=0.001), None
    if timing == ["run_at"]:
        return None, None
    cron = values["cron"]
    # The cheap checks first: croniter's parse of a 100 KB string takes a second.
    problem = ("must be a string" if not isinstance(cron, str)
               else f"must be at most {MAX_LEN['cron']} characters"
               if len(cron) > MAX_LEN["cron"] else cron_problem(cron.strip(), day_rule))
    if problem:
        raise ValidationError("cron", cron, problem)
    return None, " ".join(cron.split())


def _check_serialisable(fields: Mapping[str, Any]) -> None:
    # The other fields are checked primitives: only the containers can fail to
    # serialise, and encoding just them is much cheaper than job.to_json().
    for name in ("meta", "args", "kwargs"):
        value = fields[name]
        if value:
            problem = _json_problem(value)
            if problem:
                raise ValidationError(name, value, problem)


def _json_problem(value: Any) -> str | None:
    """Why a meta/args/kwargs value cannot be stored everywhere a job goes, or None.

    Redis, Celery messages, SQL JSON columns and exports all hold it, so it
    must be strict JSON: no NaN or Infinity, string keys, valid Unicode
    without NUL (PostgreSQL's jsonb refuses ``\\u0000``), bounded depth and size.
    """
    problem = _shape_problem(value)
    if problem:
        return problem
    try:
        text = _encode(value)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            return "must not contain NaN or Infinity (not JSON)"
        return f"must be JSON-serialisable: {exc}"  # e.g. an int over 4300 digits
    except TypeError as exc:
        return f"must be JSON-serialisable: {exc}"
    if len(text) > MAX_JSON_CHARS:
        return f"must be at most {MAX_JSON_CHARS:,} characters as JSON, not {len(text):,}"
    # ensure_ascii=False leaves surrogates as they are and escapes only NUL and
    # other control characters: an ASCII text without a \u0000 escape is clean.
    if "\\u0000" in text and NUL_ESCAPE.search(text):
        return "must not contain NUL characters"
    if not text.isascii() and SURROGATE.search(text):
        return "must be valid Unicode (it holds a lone surrogate)"
    return None


def _shape_problem(value: Any) -> str | None:
    # Recursion stops at MAX_DEPTH, so it never nears the interpreter's limit
    # (the values nested past that limit are the ones rejected here). The item
    # budget also bounds a structure that shares one list many times (its JSON
    # would be huge). Every item takes at least one character of JSON.
    return _walk(value, 1, [MAX_JSON_CHARS])


def _walk(node: Any, depth: int, budget: list[int]) -> str | None:
    if depth > MAX_DEPTH:
        return f"must be nested at most {MAX_DEPTH} levels deep"
    budget[0] -= len(node)
    if budget[0] < 0:
        return f"must be at most {MAX_JSON_CHARS:,} characters as JSON"
    if isinstance(node, dict):
        # map(isinstance, ...): the common flat meta {"site": "x"} stays in C.
        if not all(map(isinstance, node, _ALWAYS_STR)):
            return "must have only string keys (JSON object keys are strings)"
        node = node.values()
    if any(map(isinstance, node, _ALWAYS_CONTAINERS)):
        for item in node:
            if isinstance(item, _CONTAINERS):
                problem = _walk(item, depth + 1, budget)
                if problem:
                    return problem
    return None


_CONTAINERS = (dict, list, tuple)
# Second arguments of map(isinstance, items, ...): endless, so never used up.
_ALWAYS_STR = itertools.repeat(str)
_ALWAYS_CONTAINERS = itertools.repeat(_CONTAINERS)


# Strict JSON: NaN and Infinity raise instead of writing what no JSON parser
# (nor PostgreSQL's jsonb) reads back.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

