"""The admin's Domains pages and the domain lines of ``zsched_stats``, against real Redis.

Edits must reach Redis at once (the store is read back after each), bad
input must be an inline error that writes nothing, and the pages must work
with pacing off (with a note) and with Redis down (with an error).
"""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from celery_zsched.contrib.django import conf
from celery_zsched.store import Store
from tests.helpers import settle_all

pytestmark = pytest.mark.django_db

DOMAINS = "admin:zsched_domains"
CHANGE = "admin:zsched_domain_change"
RESET = "admin:zsched_domain_reset"
PACING_OFF = "Pacing is off"


@pytest.fixture
def paced(settings: Any) -> Store:
    """The Django store with pacing on: no delay and no cap, a breaker after 2 requests."""
    settings.CELERY_ZSCHED_PACING = True
    settings.CELERY_ZSCHED_DOMAIN_DELAY_S = 0
    settings.CELERY_ZSCHED_DOMAIN_MAX_IN_FLIGHT = 0
    settings.CELERY_ZSCHED_BREAKER_MIN_REQUESTS = 2
    settings.CELERY_ZSCHED_BREAKER_COOLDOWN_S = 600
    return conf.get_store()  # a new one: changing a setting reset the cached store


def form(**overrides: Any) -> dict[str, Any]:
    """POST data of a domain's form: the defaults, changed by ``overrides``."""
    data: dict[str, Any] = {"delay_s": "1.0", "max_in_flight": "1", "adaptive": "on"}
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def conf_hash(store: Store) -> dict[str, str]:
    return dict(store.client.hgetall(store.keys.domain_conf))


# -------------------------------------------------------------------- list
def test_the_job_list_links_to_domains_and_an_empty_list_says_pacing_is_off(
        admin_client: Client, zstore: Store) -> None:
    jobs = admin_client.get(reverse("admin:zsched_zschedjob_changelist")).content.decode()
    assert f'href="{reverse(DOMAINS)}"' in jobs
    response = admin_client.get(reverse(DOMAINS))
    assert response.status_code == 200
    html = response.content.decode()
    assert PACING_OFF in html
    assert "No domains yet" in html


def test_the_list_shows_each_domain_with_the_cli_columns(admin_client: Client,
                                                         paced: Store) -> None:
    paced.set_domain("tuned.example", delay_s=2.5, max_in_flight=3, adaptive=False)
    settle_all(paced, "slow.example", 1, "error", 429, retry_after_s=120)
    settle_all(paced, "down.example", 3, "error", 500)
    response = admin_client.get(reverse(DOMAINS))
    assert response.status_code == 200
    html = response.content.decode()
    assert PACING_OFF not in html
    rows = {cells["name"]: cells for cells, _change, _reset in response.context["rows"]}
    assert list(rows) == ["down.example", "slow.example", "tuned.example"]
    assert (rows["tuned.example"]["delay"], rows["tuned.example"]["cap"],
            rows["tuned.example"]["override"]) == ("2.5s/2.5s", "0/3", "yes, fixed")
    assert rows["slow.example"]["closed_until"].startswith("in ")
    assert rows["slow.example"]["throttled_429"] == "1"
    assert rows["down.example"]["breaker"].startswith("open, in ")
    assert rows["down.example"]["failed"] == "3"
    for header in ("Delay now/conf", "In flight/cap", "Breaker", "Closed until", "Last 429",
                   "Completed", "Failed", "429s", "Held"):
        assert f">{header}</th>" in html
    assert f'href="{reverse(CHANGE, args=["slow.example"])}"' in html


def test_search_filters_and_offers_a_host_without_state(admin_client: Client,
                                                        zstore: Store) -> None:
    for host in ("a.example", "b.example"):
        zstore.set_domain(host, delay_s=2)
    response = admin_client.get(reverse(DOMAINS), {"q": "b.ex"})
    assert [c["name"] for c, _, _ in response.context["rows"]] == ["b.example"]
    response = admin_client.get(reverse(DOMAINS), {"q": "B.Example"})
    assert [c["name"] for c, _, _ in response.context["rows"]] == ["b.example"]
    assert response.context["open_url"] == ""  # it has a row already
    response = admin_client.get(reverse(DOMAINS), {"q": "Bücher.example"})
    assert response.context["open_url"] == reverse(CHANGE, args=["xn--bcher-kva.example"])
    assert "No domain matches" in response.content.decode()
    response = admin_client.get(reverse(DOMAINS), {"q": "not a host!"})
    assert response.status_code == 200 and response.context["open_url"] == ""


# ------------------------------------------------------------- change page
def test_the_change_page_shows_the_configured_values(admin_client: Client,
                                                     zstore: Store) -> None:
    zstore.set_domain("a.example", delay_s=3, max_in_flight=2)
    response = admin_client.get(reverse(CHANGE, args=["a.example"]))
    assert response.status_code == 200
    assert response.context["form"].initial == {"delay_s": 3.0, "max_in_flight": 2,
                                                "adaptive": True}
    html = response.content.decode()
    assert 'name="delay_s"' in html and 'value="3.0"' in html
    assert f'action="{reverse(RESET, args=["a.example"])}"' in html


def test_saving_writes_through_to_redis(admin_client: Client, zstore: Store) -> None:
    url = reverse(CHANGE, args=["a.example"])
    response = admin_client.post(url, form(delay_s="2.5", max_in_flight="4", adaptive=None),
                                 follow=True)
    assert response.redirect_chain == [(url, 302)]
    assert messages_of(response) == [
        "Saved a.example: delay 2.5s, max in flight 4, fixed delay."]
    info = conf.get_store().domain("a.example")
    assert (info.base_delay_s, info.max_in_flight, info.adaptive, info.overridden) == (
        2.5, 4, False, True)


def test_only_changed_fields_are_written_the_rest_follow_the_defaults(
        admin_client: Client, zstore: Store, settings: Any) -> None:
    admin_client.post(reverse(CHANGE, args=["a.example"]), form(delay_s="5"), follow=True)
    settings.CELERY_ZSCHED_DOMAIN_MAX_IN_FLIGHT = 7  # a new default, after the edit
    info = conf.get_store().domain("a.example")
    assert (info.base_delay_s, info.max_in_flight) == (5.0, 7)

    before = conf_hash(zstore)
    response = admin_client.post(reverse(CHANGE, args=["b.example"]),
                                 form(max_in_flight="7"), follow=True)
    assert messages_of(response) == ["Nothing changed for b.example."]
    assert conf_hash(zstore) == before


@pytest.mark.parametrize(("data", "field", "error"), [
    ({"delay_s": "-1"}, "delay_s", "greater than or equal to 0"),
    ({"delay_s": "soon"}, "delay_s", "Enter a number."),
    ({"delay_s": "inf"}, "delay_s", "Enter a number."),
    ({"delay_s": "nan"}, "delay_s", "Enter a number."),
    ({"delay_s": ""}, "delay_s", "This field is required."),
    ({"max_in_flight": "-1"}, "max_in_flight", "greater than or equal to 0"),
    ({"max_in_flight": "2.5"}, "max_in_flight", "Enter a whole number."),
    ({"max_in_flight": "9" * 5000}, "max_in_flight", "Enter a whole number."),
])
def test_invalid_input_is_an_inline_error_and_writes_nothing(
        admin_client: Client, zstore: Store, data: dict[str, str], field: str,
        error: str) -> None:
    response = admin_client.post(reverse(CHANGE, args=["a.example"]), form(**data))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == [field] and error in errors[field][0]
    html = response.content.decode()
    assert "Please correct the error below." in html
    assert f'class="form-row errors field-{field}"' in html
    assert conf_hash(zstore) == {}


def test_a_host_is_shown_at_its_canonical_name(admin_client: Client, zstore: Store) -> None:
    response = admin_client.get(reverse(CHANGE, args=["Bücher.Example"]))
    assert response.status_code == 302
    assert response["Location"] == reverse(CHANGE, args=["xn--bcher-kva.example"])
    assert admin_client.get(reverse(CHANGE, args=["bad host!"])).status_code == 404


# ------------------------------------------------------------------- reset
def test_reset_drops_the_override_and_the_learned_state(admin_client: Client,
                                                        paced: Store) -> None:
    settle_all(paced, "down.example", 3, "error", 500)
    paced.set_domain("down.example", delay_s=4)
    assert paced.domain("down.example").breaker == "open"
    url = reverse(RESET, args=["down.example"])
    assert admin_client.get(url).status_code == 405  # never by a link
    response = admin_client.post(url, follow=True)
    assert response.redirect_chain == [(reverse(DOMAINS), 302)]
    assert messages_of(response) == [
        "Reset down.example: its override and learned state are gone."]
    info = paced.domain("down.example")
    assert (info.overridden, info.breaker, info.failed, info.base_delay_s) == (
        False, "closed", 0, 0.0)
    # A domain that only had an override has nothing left to reset afterwards.
    other = reverse(RESET, args=["only-set.example"])
    paced.set_domain("only-set.example", delay_s=3)
    admin_client.post(other)
    response = admin_client.post(other, follow=True)
    assert messages_of(response)[-1] == "only-set.example had nothing to reset."


# ------------------------------------------------------------ permissions
def test_viewers_see_domains_but_cannot_change_them(client: Client, zstore: Store) -> None:
    zstore.set_domain("a.example", delay_s=2)
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_zschedjob"))
    client.force_login(viewer)
    assert client.get(reverse(DOMAINS)).status_code == 200
    page = client.get(reverse(CHANGE, args=["a.example"]))
    assert page.status_code == 200
    assert b'value="Save"' not in page.content and b"disabled" in page.content
    assert client.post(reverse(CHANGE, args=["a.example"]), form(delay_s="9")).status_code == 403
    assert client.post(reverse(RESET, args=["a.example"])).status_code == 403
    assert zstore.domain("a.example").base_delay_s == 2.0

    nobody = User.objects.create_user("nobody", password="pw", is_staff=True)
    client.force_login(nobody)
    assert client.get(reverse(DOMAINS)).status_code == 403


# -------------------------------------------------------------- Redis down
def test_redis_down_shows_on_the_pages(admin_client: Client, zstore: Store,
                                       settings: Any) -> None:
    settings.CELERY_ZSCHED_REDIS_URL = "redis://127.0.0.1:1/0"  # refuses at once
    for url in (reverse(DOMAINS), reverse(CHANGE, args=["a.example"])):
        response = admin_client.get(url)
        assert response.status_code == 200
        assert "Redis unavailable" in response.content.decode()
    response = admin_client.post(reverse(RESET, args=["a.example"]), follow=True)
    assert messages_of(response)[0].startswith("Nothing changed: Redis unreachable")


# ------------------------------------------------------------ zsched_stats
def test_zsched_stats_names_throttled_domains_and_open_breakers(paced: Store) -> None:
    settle_all(paced, "slow.example", 1, "error", 429, retry_after_s=120)
    settle_all(paced, "down.example", 3, "error", 500)
    out = StringIO()
    call_command("zsched_stats", "--json", stdout=out)
    stats = json.loads(out.getvalue())
    assert stats["domains"] == {"throttled": ["slow.example"], "breakers_open": ["down.example"]}
    assert (stats["redis"]["domains_throttled"], stats["redis"]["breakers_open"]) == (1, 1)
    out = StringIO()
    call_command("zsched_stats", stdout=out)
    text = out.getvalue()
    assert "Throttled domains: 1 (slow.example)" in text
    assert "Breakers open: 1 (down.example)" in text


def test_zsched_stats_says_nothing_of_domains_with_pacing_off(zstore: Store) -> None:
    out = StringIO()
    call_command("zsched_stats", "--json", stdout=out)
    assert "domains" not in json.loads(out.getvalue())
