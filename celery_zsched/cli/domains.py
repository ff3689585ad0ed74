"""``celery -A proj zsched domains [set|reset]``: per-domain pacing from the command line.

``zsched domains`` lists every domain Redis knows (state or an override);
``set`` writes a per-domain override and ``reset`` drops it together with
what the domain learned (adaptive delay, Retry-After gate, breaker, counts).
It works with ``zsched_pacing`` off too (overrides wait for it to be on), and
says so, because an operator tuning a domain that is not paced would
otherwise wonder why nothing changes.

Attached to the ``zsched`` group at the end of :mod:`celery_zsched.cli`,
whose error handling (one-line messages, exit codes) it shares.
"""

from __future__ import annotations

import json
import math

import click

from celery_zsched.cli.helpers import EX_DATAERR, echo, fail, handles_errors, store_of
from celery_zsched.core import domain_table
from celery_zsched.core.domains import normalise_domain
from celery_zsched.core.errors import ValidationError, got
from celery_zsched.services import planner
from celery_zsched.store import Store

# Option of each DomainInfo/set_domain field, to name it in the store's errors.
_OPTION_OF = {"delay_s": "--delay", "max_in_flight": "--max-in-flight", "adaptive": "--adaptive"}


def _host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    # Normalised as job URLs are, so `set Bücher.example` reaches the gate the
    # jobs of https://bücher.example/ are paced under.
    try:
        return normalise_domain(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _delay(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    # click's FloatRange lets nan and inf through; neither is a delay.
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter(f"must be a finite number of seconds >= 0, got {value!r}",
                                 ctx=ctx, param=param)
    return value


_HOST = click.argument("host", metavar="HOST", callback=_host)


def _pacing_note(store: Store) -> None:
    if not store.settings.pacing:
        click.echo("note: zsched_pacing is off, so no domain is paced; overrides set here "
                   "take effect once it is on.", err=True)


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--replan", is_flag=True,
              help="Recompute the capacity planner now instead of using its last result.")
@click.pass_context
@handles_errors
def domains(ctx: click.Context, as_json: bool, replan: bool) -> None:
    """Per-domain pacing: list the domains, or `set` / `reset` one.

    Without a subcommand, lists every domain with pacing state, an override or
    jobs: the delay in force over the configured one and where that comes from
    (default, config, override, robots), requests in flight over the cap, the
    breaker, the Retry-After gate, the last 429, the counts, and the capacity
    planner's verdict: the fetches a day its jobs ask for over those its pacing
    allows, and the lateness an over-subscribed domain will cause.
    """
    if ctx.invoked_subcommand is not None:
        return
    store = store_of(ctx)
    infos, plans, demand = planner.domain_plans(store, fresh=replan)
    _pacing_note(store)
    if as_json:
        echo(ctx, json.dumps([domain_table.as_json(i, plans.get(i.name)) for i in infos],
                             indent=2))
        return
    if not infos:
        echo(ctx, "no domains yet: none has pacing state, an override or jobs")
        return
    for line in domain_table.render(infos, plans):
        echo(ctx, line)
    over = [p for p in plans.values() if p.oversubscribed]
    age = domain_table.span(max(0, (infos[0].now_ms - demand.computed_ms)))
    # A note, not a row: on stderr, so the table stays machine-readable.
    click.echo(f"planner: {len(over)} over-subscribed of {len(plans)} domains with jobs "
               f"({demand.jobs} jobs, computed {age} ago; --replan to recompute)", err=True)


@domains.command("set")
@_HOST
@click.option("--delay", type=float, callback=_delay, metavar="SECONDS",
              help="Least delay between two request starts to HOST.")
@click.option("--max-in-flight", type=click.IntRange(min=0), metavar="N",
              help="Most requests to HOST in flight; 0 is unlimited.")
@click.option("--adaptive/--no-adaptive", default=None,
              help="Raise the delay on 429s and lower it on successes (default: on).")
@click.pass_context
@handles_errors
def set_(ctx: click.Context, host: str, delay: float | None, max_in_flight: int | None,
         adaptive: bool | None) -> None:
    """Override HOST's pacing; options not given keep their value."""
    if delay is None and max_in_flight is None and adaptive is None:
        raise click.UsageError("give at least one of --delay, --max-in-flight, "
                               "--adaptive/--no-adaptive")
    store = store_of(ctx)
    try:
        info = store.set_domain(host, delay_s=delay, max_in_flight=max_in_flight,
                                adaptive=adaptive)
    except ValidationError as exc:
        option = _OPTION_OF.get(exc.field, exc.field)
        fail(f"invalid {option}: {exc.message}{got(exc.value)}", EX_DATAERR)
    except ValueError as exc:  # the store's own checks, should they be plain ValueErrors
        fail(f"invalid value for {host}: {exc}", EX_DATAERR)
    _pacing_note(store)
    for line in domain_table.render([info]):
        echo(ctx, line)


@domains.command()
@_HOST
@click.pass_context
@handles_errors
def reset(ctx: click.Context, host: str) -> None:
    """Drop HOST's override and learned state (delay, gate, breaker, counts).

    Jobs of HOST in flight stay counted until they settle.
    """
    changed = store_of(ctx).reset_domain(host)
    echo(ctx, f"reset {host}" if changed else f"{host}: nothing to reset")


@domains.command()
@click.pass_context
@handles_errors
def refresh(ctx: click.Context) -> None:
    """Teach every stored job its domain (after turning zsched_pacing on).

    Jobs learn their domain when they are stored; jobs stored while pacing was
    off (or before zsched_domain_registrable changed) are not paced until this
    runs or they are imported again. Schedules do not move.
    """
    store = store_of(ctx)
    _pacing_note(store)
    echo(ctx, f"refreshed {store.refresh_domains()} jobs")
