"""``zsched add`` takes every job field an import row takes, and names the option
of a bad value (issue 12).

The import columns are the fields of :class:`celery_zsched.core.job.Job`, so a new
field without an ``add`` option fails the first test here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from click.testing import Result

from celery_zsched.cli.helpers import option_of
from celery_zsched.cli.jobs import add
from celery_zsched.core.formats import COLUMNS
from celery_zsched.store import Store
from tests.cli_env import cli_prefix, invoke
from tests.helpers import store_snapshot

Run = Callable[..., Result]


@pytest.fixture
def prefix(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from cli_prefix(redis_url, monkeypatch, "cliadd")


@pytest.fixture
def zstore(make_store: Callable[..., Store], prefix: str) -> Store:
    return make_store(timezone="Europe/Berlin", key_prefix=prefix)


def test_every_import_column_has_an_add_option() -> None:
    options = {opt for param in add.params for opt in param.opts}
    missing = [column for column in COLUMNS if option_of(column) not in options]
    assert missing == [], f"import columns without a `zsched add` option: {missing}"


def test_add_stores_retries_and_domain(zstore: Store) -> None:
    result = invoke("add", "--url", "https://a.example/x", "--interval", "60",
                    "--retry-max", "5", "--retry-base", "2.5", "--domain", "Example.ORG")
    assert result.exit_code == 0, result.output
    job = zstore.get(result.stdout.split()[0]).job
    assert (job.retry_max, job.retry_base_s, job.domain) == (5, 2.5, "example.org")


@pytest.mark.parametrize(("args", "message"), [
    (["--retry-max", "-1"], "invalid --retry-max: must be between 0 and 1000 (got -1)"),
    (["--retry-max", "1001"], "invalid --retry-max: "),
    (["--retry-base", "0"], "invalid --retry-base: "),
    (["--domain", "not a domain!"], "invalid --domain: "),
])
def test_a_bad_value_names_its_option_and_writes_nothing(
        zstore: Store, args: list[str], message: str) -> None:
    before = store_snapshot(zstore)
    result = invoke("add", "--url", "https://a.example/x", "--interval", "60", *args)
    assert result.exit_code == 65, result.output
    assert message in result.stderr
    assert "retry_base_s" not in result.stderr and "retry_max" not in result.stderr
    assert store_snapshot(zstore) == before


def test_a_value_of_the_wrong_type_is_a_usage_error_naming_the_option(zstore: Store) -> None:
    result = invoke("add", "--url", "https://a.example/x", "--retry-max", "three")
    assert result.exit_code == 2
    assert "'--retry-max'" in result.stderr
    assert store_snapshot(zstore)["keys"] == 0
