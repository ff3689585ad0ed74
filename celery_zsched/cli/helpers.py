"""What the ``zsched`` commands share: the app and store of the invocation, output
that is safe on a terminal, exit codes, errors as exit statuses, and options."""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, ParamSpec, TextIO, TypeVar

import celery._state
import click
import redis
from celery.bin.base import CeleryOption
from celery.exceptions import CeleryCommandException

from celery_zsched.config import Settings, redact_url
from celery_zsched.core.errors import (
    ConfigurationError,
    ImportValidationError,
    JobNotFound,
    StoreUnavailable,
    ValidationError,
)
from celery_zsched.core.job import Defaults
from celery_zsched.core.timing import ms_to_dt
from celery_zsched.services.appstore import app_timezone, store_for_app
from celery_zsched.store import Store

P = ParamSpec("P")
R = TypeVar("R")

EX_NOT_FOUND = 1
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_CONFIG = 78

_STORE_META = "celery_zsched.store"
_NOTED_META = "celery_zsched.default_app_noted"
#: Errors listed before "... and N more" when rows are skipped.
MAX_LISTED = 50
# CLI option of each job field whose name differs from ``--field-name``.
_OPTION_OF = {
    "interval_s": "--interval", "timezone": "--tz", "jitter_s": "--jitter",
    "expires_s": "--expires", "misfire_grace_s": "--misfire-grace", "enabled": "--paused",
    "kwargs": "--kwarg", "args": "--arg", "retry_base_s": "--retry-base",
    "min_interval_s": "--min-interval", "max_interval_s": "--max-interval",
}

# A job field's name as a word of a message ("after start_at", "one of interval_s, cron").
_FIELD_WORD = re.compile(r"(?<![\w-])(interval_s|cron|run_at|start_at|end_at|timezone|jitter_s|"
                         r"expires_s|misfire_grace_s|max_runs|day_rule|retry_max|retry_base_s|"
                         r"min_interval_s|max_interval_s|freshness_target|recrawl)"
                         r"(?![\w-])(?! expression)")


def option_of(field: str) -> str:
    """The ``add`` option that sets job field ``field``: ``--misfire-grace``, ``--cron``."""
    return _OPTION_OF.get(field, "--" + field.replace("_", "-"))


def user_words(message: str) -> str:
    """``message`` with the job fields it names written as the options that set them."""
    return _FIELD_WORD.sub(lambda m: option_of(m.group(1)), message)


def fail(message: str, code: int) -> NoReturn:
    raise CeleryCommandException(message=message, exit_code=code)


def handles_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the package's errors into one-line messages and exit codes, never tracebacks."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ImportValidationError as exc:
            fail(str(exc), EX_DATAERR)
        except ValidationError as exc:
            fail(str(exc), EX_DATAERR)
        except JobNotFound as exc:
            fail(str(exc), EX_NOT_FOUND)
        except ConfigurationError as exc:
            fail(f"configuration: {exc}", EX_CONFIG)
        except StoreUnavailable as exc:
            fail(f"cannot reach {where()}: {exc.__cause__ or exc}", EX_UNAVAILABLE)
        except redis.RedisError as exc:
            fail(f"{where()} failed: {exc}", EX_UNAVAILABLE)
    return wrapper


def where() -> str:
    ctx = click.get_current_context(silent=True)
    # ctx.meta is shared by the whole context chain; store_of() records the store there.
    store = ctx.meta.get(_STORE_META) if ctx is not None else None
    if not isinstance(store, Store):
        return "Redis"
    return f"Redis at {redact_url(store.settings.redis_url)} (prefix {store.keys.prefix})"


def app_of(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        fail("run this as `celery -A proj zsched ...`, so there is a Celery app", EX_CONFIG)
    if is_default_app(ctx, app) and not ctx.meta.get(_NOTED_META):
        ctx.meta[_NOTED_META] = True
        # Said before any Redis is touched: without -A the settings are Celery's
        # defaults, so the store is most likely not the one the user meant.
        click.echo("zsched: no -A/--app given: using Celery's default app and its settings "
                   f"({redact_url(Settings.from_app(app).redis_url)})", err=True)
    return app


def is_default_app(ctx: click.Context, app: Any) -> bool:
    """``app`` is the fallback app Celery makes when no ``-A``/``--app`` names one."""
    root = ctx.find_root()
    return not root.params.get("app") and app is getattr(celery._state, "default_app", None)


def store_of(ctx: click.Context) -> Store:
    store = store_for_app(app_of(ctx))
    ctx.meta[_STORE_META] = store
    return store


def defaults_of(ctx: click.Context, store: Store) -> Defaults:
    return Defaults.from_settings(store.settings, app_timezone(app_of(ctx)))


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return ms_to_dt(ms).isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: What a terminal acts on rather than shows: C0 controls but newline and tab, DEL,
#: C1 controls (U+009B is CSI on its own), and the bidirectional and line-breaking
#: format characters that reorder or split what is shown.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029"
                              "\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with each character a terminal would act on written as its escape
    (``\\x1b``, ``\\u202e``); newlines and tabs are kept."""
    return _TERMINAL_UNSAFE.sub(
        lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def on_tty(err: bool = False) -> bool:
    """Whether the command's stdout (``err``: stderr) is a terminal."""
    stream: TextIO = sys.stderr if err else sys.stdout  # click's runner swaps these too
    return stream.isatty()


def echo(ctx: click.Context, message: str) -> None:
    """Print a line of output. On a terminal, stored text (a worker's error, a note, a
    URL) cannot clear the screen, recolour it or retitle the window: its control
    characters are shown escaped. Piped or redirected output is left as it is."""
    if on_tty():
        message = terminal_safe(message)
    obj = ctx.find_root().obj
    if obj is not None and hasattr(obj, "echo"):
        obj.echo(message)
    else:
        click.echo(message)


def warn(message: str) -> None:
    """Print a line on stderr (progress, skipped rows), escaped as :func:`echo` does."""
    click.echo(terminal_safe(message) if on_tty(err=True) else message, err=True)



def option(*decls: str, group: str, **attrs: Any) -> Callable[[Callable[..., Any]], Any]:
    return click.option(*decls, cls=CeleryOption, help_group=group, **attrs)


def with_options(options: list[Callable[[Callable[..., Any]], Any]]
                  ) -> Callable[[Callable[..., Any]], Any]:
    def decorate(fn: Callable[..., Any]) -> Any:
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


NOTE: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--note", default="", metavar="TEXT",
    help="Why: recorded with the change (zsched history ID shows it).")


@contextlib.contextmanager
def progress_bar(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A callback taking the count done so far: a bar on a terminal, else a line per 10%."""
    if sys.stderr.isatty():
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            seen = [0]

            def advance(done: int) -> None:
                bar.update(done - seen[0])
                seen[0] = done
            yield advance
        return
    last = [-1, -1]  # the count and the tenth printed last

    def report(done: int) -> None:
        # A line per tenth, and one at the end: readable in CI logs, never a flood.
        tenth = done * 10 // max(total, 1)
        if done != last[0] and (tenth > last[1] or done >= total):
            percent = 100 * done // total if total else 100
            warn(f"{label}: {done}/{total} ({percent}%)")
            last[0], last[1] = done, tenth
    yield report
