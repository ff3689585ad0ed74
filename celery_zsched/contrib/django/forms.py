"""The job form of the admin: every bad value is an error on its field, never a server error.

Django's own ``forms.JSONField`` catches only ``JSONDecodeError``: deeply
nested input raises ``RecursionError`` and a number of more than 4300 digits
a bare ``ValueError``, both while cleaning and again while re-rendering the
invalid form. :class:`SafeJSONField` turns those into field errors. The rest
of the validation is the model's (:meth:`ZSchedJob.full_clean`).
"""

from __future__ import annotations

import json
import re
import zoneinfo
from functools import cache
from typing import Any, ClassVar

import django
from django import forms
from django.contrib.admin.widgets import AdminTextInputWidget
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from celery_zsched.contrib.django.models import DEFINITION_FIELDS, ZSchedJob

# Lone surrogates: a page holding one cannot be encoded as UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")


class SafeJSONField(forms.JSONField):
    """``forms.JSONField`` whose every bad input is a validation error."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError as exc:
            raise DjangoValidationError("Enter valid JSON: it is nested too deeply.",
                                        code="invalid") from exc
        except ValueError as exc:  # not a JSONDecodeError (Django catches those)
            raise DjangoValidationError(f"Enter valid JSON: {str(exc).split(';')[0]}.",
                                        code="invalid") from exc

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except (RecursionError, ValueError):
            return InvalidJSONInput(data)  # shown back as typed, with its error

    def prepare_value(self, value: Any) -> Any:
        try:
            text = super().prepare_value(value)
        except (RecursionError, ValueError, TypeError):
            return InvalidJSONInput("")  # a stored value this form cannot show
        if isinstance(text, str) and not text.isascii() and _SURROGATE.search(text):
            # ensure_ascii keeps the lone surrogate as a \\udXXX escape.
            return json.dumps(value, cls=self.encoder)
        return text


@cache
def _zone_options() -> SafeString:
    # The tz database is read once per process, and its ~600 names escaped once.
    return format_html_join("", '<option value="{}">', ((name,) for name in
                                                        sorted(zoneinfo.available_timezones())))


class TimeZoneInput(AdminTextInputWidget):
    """A text box that suggests every IANA zone as you type (``<input list>`` + ``<datalist>``).

    The browser filters the list by what is typed (``berl`` finds
    ``Europe/Berlin``), with no script and no external assets, and the box
    still takes any text: the server validates the zone and names the field.
    """

    DATALIST_ID = "zsched-timezones"

    def __init__(self, attrs: dict[str, Any] | None = None) -> None:
        super().__init__({"list": self.DATALIST_ID, "autocomplete": "off",
                          "placeholder": "e.g. Europe/Berlin", **(attrs or {})})

    def render(self, name: str, value: Any, attrs: dict[str, Any] | None = None,
               renderer: Any = None) -> SafeString:
        box = super().render(name, value, attrs, renderer)
        return format_html('{}<datalist id="{}">{}</datalist>', box, self.DATALIST_ID,
                           _zone_options())


def _formfield(db_field: models.Field, **kwargs: Any) -> Any:
    if isinstance(db_field, models.URLField) and django.VERSION >= (5, 0):
        kwargs.setdefault("assume_scheme", "https")  # say it, rather than rely on a default
    return db_field.formfield(**kwargs)


class ZSchedJobForm(forms.ModelForm):
    """Every definition field of :class:`ZSchedJob`; the admin's form.

    An empty ``meta``, ``args`` or ``kwargs`` box means "none" (``{}`` or ``[]``).
    """

    class Meta:
        model = ZSchedJob
        fields = DEFINITION_FIELDS
        field_classes: ClassVar[dict[str, type]] = {
            "meta": SafeJSONField, "args": SafeJSONField, "kwargs": SafeJSONField}
        formfield_callback = _formfield
        widgets: ClassVar[dict[str, forms.Widget]] = {"timezone": TimeZoneInput()}

    def clean_meta(self) -> Any:
        return self._json_or_empty("meta", dict)

    def clean_args(self) -> Any:
        return self._json_or_empty("args", list)

    def clean_kwargs(self) -> Any:
        return self._json_or_empty("kwargs", dict)

    def _json_or_empty(self, name: str, empty: type) -> Any:
        value = self.cleaned_data.get(name)
        return empty() if value is None else value
