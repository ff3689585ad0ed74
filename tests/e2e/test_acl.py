"""The documented minimal ACL rule (docs/how-to/connections.md, once the README's):
beat, a worker, the CLI and the store's maintenance run as that user, Redis refuses
none of their commands, and it refuses anything else."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from celery_zsched.config import Settings
from celery_zsched.store import Store
from e2e.conftest import CELERY, REPO_ROOT, Deployment, TargetServer
from e2e.names import APP_MODULE
from tests.docs_pages import page, pages
from tests.servers import RedisServer, running

ACL_PAGE = "how-to/connections.md"
LUA = REPO_ROOT / "celery_zsched" / "store" / "lua"
PLACEHOLDER = "CHANGE-ME"


def readme_rule() -> list[str]:
    """The words of the documented ``ACL SETUSER`` line (the only one in the docs)."""
    rules: list[str] = [rule for text in pages().values()
                        for rule in re.findall(r"^ACL SETUSER .*$", text, re.M)]
    assert len(rules) == 1, rules
    assert rules[0] in page(ACL_PAGE), f"the rule is expected in docs/{ACL_PAGE}"
    return rules[0].split()


def allowed_commands(rule: list[str]) -> set[str]:
    """The ``+command`` and ``+command|sub`` grants of a rule, upper case."""
    return {word[1:].upper() for word in rule if word.startswith("+")}


def test_the_rule_grants_every_command_the_scripts_call() -> None:
    rule = readme_rule()
    assert rule[:4] == ["ACL", "SETUSER", "zsched", "on"]
    assert "~{zsched}:*" in rule and "-@all" in rule and "resetkeys" in rule
    assert not any(word.endswith("{zsched*") for word in rule), "a neighbour prefix's keys"
    called = {name.upper() for path in LUA.glob("*.lua")
              for name in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", path.read_text())}
    assert called, "no redis.call found: the pattern is out of date"
    assert called <= allowed_commands(rule), called - allowed_commands(rule)


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, str]]:
    """A throwaway server with the documented user; yields it and that user's URL."""
    password = secrets.token_hex(8)
    rule = readme_rule()
    assert ">" + PLACEHOLDER in rule
    rule = [">" + password if w == ">" + PLACEHOLDER else w for w in rule]
    with running(RedisServer(tmp_path / "acl-redis")) as (server,):
        with server.admin() as admin:
            assert admin.execute_command(*rule) == "OK"
            admin.execute_command("ACL", "LOG", "RESET")
        yield server, server.url(user=rule[2], password=password)


def assert_confined(server: RedisServer, url: str) -> None:
    """The README user reaches the store's keys and channels, in its database, and
    nothing of a neighbour prefix or another database, not even through a script."""
    with redis.Redis.from_url(url, decode_responses=True) as user:
        for key in ("{zsched}:defs", "{zsched:0}:defs", "{zsched:7}:x", "{zsched:12}:x",
                    "{zsched:999}:x"):
            assert user.set(key, "1") and user.delete(key) == 1
        assert user.publish("{zsched:3}:http_wake", "1") == 0
        for key in ("{zschedXYZ}:defs", "{zsched-other}:defs", "{zsched:x}:defs",
                    "{zsched:07}:defs", "{zsched:1000}:defs", "{zsched}", "zsched:defs"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.set(key, "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.publish("{zschedXYZ}:http_wake", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.execute_command("SELECT", "3")
        with pytest.raises(redis.exceptions.ResponseError, match="can't run this command"):
            user.eval("redis.call('select', 3); return redis.call('set', KEYS[1], 1)", 1,
                      "{zsched}:x")
    # A URL naming another database fails at connecting (its SELECT is refused).
    other_db = url.rsplit("/", 1)[0] + "/3"
    with redis.Redis.from_url(other_db) as user, \
            pytest.raises(redis.exceptions.NoPermissionError):
        user.ping()
    with server.admin(db=3) as admin:
        assert admin.dbsize() == 0, "a script of the user wrote to database 3"


def test_the_rule_grants_the_prefix_in_one_database_and_refuses_neighbours(
        acl_redis: tuple[RedisServer, str]) -> None:
    server, url = acl_redis
    assert_confined(server, url)


def refusals(server: RedisServer) -> list[dict[str, object]]:
    """The server's ACL LOG: each entry a refused command or key.

    ``CLIENT SETINFO`` (Redis 7.2+), which redis-py sends on connecting and
    whose refusal it ignores, is left out.
    """
    with server.admin() as admin:
        return [e for e in admin.acl_log() if str(e.get("object")) != "client|setinfo"]


@pytest.mark.slow
def test_beat_worker_cli_and_maintenance_run_as_the_readme_acl_user(
        acl_redis: tuple[RedisServer, str], deploy: Callable[..., Deployment],
        target: TargetServer, tmp_path: Path) -> None:
    server, url = acl_redis
    d = deploy(store_url=url, key_prefix="{zsched}:", lease_s=3, retry_base_s=0.5)
    ok = d.job(url=target.url("/ok/acl"), interval_s=1)
    fail = d.job(url=target.url("/fail/acl"), interval_s=1, retry_max=1)
    d.store.upsert_many([ok, fail], stagger=False)
    beat = d.start_beat()
    d.start_worker()
    d.wait_info(ok.id, lambda i: i.state.runs >= 2, 40, "two settled runs of the ok job")
    d.wait_info(fail.id, lambda i: i.state.failures >= 2, 40, "two settled errors")
    assert beat.alive()

    # The store's maintenance calls, as the same user.
    store = d.store
    assert store.pause(ok.id) == 1
    assert store.get(ok.id).state.status in {"paused", "queued", "running"}
    assert store.resume(ok.id) == 1
    assert store.run_now(fail.id) in {0, 1}
    store.reap()
    assert store.stats()["jobs"] == 2
    assert {j.id for j in store.iter_jobs()} == {ok.id, fail.id}
    assert store.list_jobs() is not None
    events = store.events()
    assert events, "settle events were written"

    # The CLI, as the same user (through the environment of the processes).
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps([{"url": f"https://a.example/acl-{i}", "interval_s": 3600}
                                     for i in range(3)]))

    def cli(*args: str) -> str:
        done = subprocess.run([CELERY, "-A", APP_MODULE, "zsched", *args], cwd=REPO_ROOT,
                              env=d.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    cli("import", "--file", str(jobs_file))
    assert "acl-" in cli("list", "--limit", "100")
    assert json.loads(cli("stats", "--json"))
    exported = json.loads(cli("export"))
    assert len(exported) == 5

    assert refusals(server) == [], "Redis refused a command of beat, worker, CLI or store"

    # Repartitioning (offline: beat and worker stopped) into {zsched:0} and {zsched:1},
    # and the CLI on the partitioned store, as the same user.
    d.stop()
    moved = cli("repartition", "--to", "2")
    assert "repartitioned 1 -> 2" in moved, moved
    d.env["ZSCHED_PARTITIONS"] = "2"
    assert len(json.loads(cli("export"))) == 5
    assert json.loads(cli("stats", "--json"))
    with server.admin() as admin:
        assert {k.split("}")[0] + "}" for k in admin.scan_iter("{zsched*")} == {
            "{zsched}", "{zsched:0}", "{zsched:1}"}
    assert refusals(server) == [], "Redis refused a command of repartition"

    # The rule is really restrictive: other commands and other keys are refused.
    with redis.Redis.from_url(url, decode_responses=True) as user:
        for command in (("FLUSHALL",), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"),
                        ("UNLINK", "{zsched}:defs"), ("GET", "other:key"),
                        ("SET", "{other}:x", "1"), ("ACL", "WHOAMI"), ("SUBSCRIBE", "x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.execute_command(*command)
        assert user.ping()
    # ... and so is a store under a prefix outside the pattern.
    settings = Settings.from_mapping({"zsched_redis_url": url, "zsched_key_prefix": "{other}:"},
                                     env={})
    with pytest.raises(redis.exceptions.NoPermissionError):
        other = Store.from_settings(settings)
        try:
            other.stats()
        finally:
            other.client.close()
