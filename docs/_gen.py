"""The generated parts of the documentation site: an MkDocs hook (``mkdocs.yml``).

A page holds a marker, ``<!-- gen:NAME [ARG] -->``, on a line of its own; the hook
replaces it with what the code says, at every build, so a reference page cannot
drift from the code. The tests read the pages through :func:`expand` too.

Every import path the generated pages read is in ``SOURCES`` below, and nowhere
else: when a module moves, this is the one place to change.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import json
import logging
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

DOCS = Path(__file__).resolve().parent
#: explanation/architecture.md: the import-linter contract (the architecture's source
#: of truth) and the entry points, read from here; each package's summary is the first
#: paragraph of its docstring, read from its file (nothing is imported).
PYPROJECT = DOCS.parent / "pyproject.toml"

#: Where each generated page reads from (module path and attribute).
SOURCES = {
    # reference/configuration.md: one table per class, in this order, under its title.
    "settings": [
        ("celery_zsched.config.redis", "RedisSettings",
         "Where the schedule lives (`RedisSettings`)"),
        ("celery_zsched.config.schedule", "ScheduleSettings",
         "Batches, the delivery contract's deadlines, retries and caps (`ScheduleSettings`)"),
        ("celery_zsched.config.pacing", "PacingSettings",
         "Per-domain pacing (`PacingSettings`)"),
        ("celery_zsched.config.robots", "RobotsSettings",
         "robots.txt and the capacity planner (`RobotsSettings`)"),
        ("celery_zsched.config.metrics", "MetricsSettings",
         "Beat's metrics (`MetricsSettings`)"),
        ("celery_zsched.config.server", "ServerSettings",
         "`zsched serve`: the job gateway and the REST API (`ServerSettings`)"),
        ("celery_zsched.config.notify", "NotifySettings",
         "The notifiers (`NotifySettings`)"),
        ("celery_zsched.config.tracing", "TracingSettings",
         "OpenTelemetry tracing (`TracingSettings`)"),
        ("celery_zsched.contrib.django.conf", "DjangoSettings",
         "Django app only (`celery_zsched.contrib.django.conf.DjangoSettings`; beat accepts "
         "and ignores them)"),
    ],
    # reference/cli.md: the click group, rendered by mkdocs-click.
    "cli": ("celery_zsched.cli", "zsched"),
    # reference/redis-layout.md: the key names and the runtime state's fields.
    "keys": ("celery_zsched.store.keys", "Keys"),
    "state": ("celery_zsched.core.state", "RuntimeState"),
}
#: The OpenAPI document the REST API reference renders (checked in, and tested to
#: equal the served one: tests/gateway/test_openapi_document.py).
OPENAPI = DOCS / "openapi.json"
#: What the code's comments and docstrings add to on the pages, by name (README text
#: kept where it says more); a name the code no longer has fails the build.
NOTES = DOCS / "_notes.yml"
#: Sections of the old single-file README that code comments still cite, and their pages.
README_SECTIONS = {
    "Operating it: audit trail": "how-to/audit.md",
    "Operating it: metrics": "how-to/metrics.md",
    "Operating it: notifications": "how-to/notifications.md",
    "Politeness": "how-to/pacing.md",
}

log = logging.getLogger("mkdocs.plugins.zsched_gen")
_MARKER = re.compile(r"^<!-- gen:(?P<name>[\w-]+)(?: (?P<arg>[^>]*?))? -->$", re.M)


def _load(source: tuple[str, str]) -> Any:
    module, name = source
    return getattr(importlib.import_module(module), name)


@functools.cache
def _notes() -> dict[str, dict[str, dict[str, str]]]:
    loaded: dict[str, dict[str, dict[str, str]]] = yaml.safe_load(NOTES.read_text("utf-8"))
    return loaded


def _check_notes(section: str, names: set[str]) -> None:
    for stale in sorted(set(_notes().get(section, {})) - names):
        log.warning("docs/_notes.yml: %s %r is not in the code any more", section, stale)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _from_rst(text: str, page: str) -> str:
    """Docstring and comment markup as Markdown, old README citations as links."""
    text = re.sub(r":\w+:`[~.]*([^`]+)`", r"`\1`", text).replace("``", "`")

    def cite(match: re.Match[str]) -> str:
        title = match.group(1)
        target = README_SECTIONS.get(title)
        if target is None:
            log.warning("a code comment cites the README's %r: add it to README_SECTIONS", title)
            return match.group(0)
        return f"[{title}]({_relative(target, page)})"

    return re.sub(r"""the README's "([^"]+)\"""", cite, text)


def _generated_from(*source: str) -> str:
    return f"*Generated from `{'.'.join(source)}`.*\n"


def _relative(target: str, page: str) -> str:
    depth = page.count("/")
    return "../" * depth + target


# ------------------------------------------------------------------ settings
def setting_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment above each field of a dataclass, by field name."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        field = re.match(r"(\w+)\s*:[^=]*=", stripped)
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
        elif field and pending:
            comments[field.group(1)] = " ".join(pending)
            pending = []
        else:
            pending = []
    return comments


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "empty"
    if isinstance(value, float):
        shown = f"{value:g}"
        return f"`{shown if 'e' not in shown else repr(value)}`"
    return f"`{value}`"


def settings_rows(cls: type, page: str) -> Iterator[str]:
    """One table row per setting: name, environment override, default, meaning."""
    notes = _notes().get("settings", {})
    comments = setting_comments(cls)
    for field in dataclasses.fields(cls):
        note = notes.get(field.name, {})
        default = _default(field.default)
        if note.get("default"):
            default += f" ({note['default']})"
        meaning = _from_rst(comments.get(field.name, ""), page)
        if not meaning:
            log.warning("%s.%s has no #: comment to document it", cls.__name__, field.name)
        if note.get("more"):
            meaning += " " + note["more"]
        yield (f"| `zsched_{field.name}` | `ZSCHED_{field.name.upper()}` | {_cell(default)} "
               f"| {_cell(meaning)} |")


def gen_settings(_arg: str, page: str) -> str:
    out, names = [], set()
    for module, name, title in SOURCES["settings"]:
        cls = _load((module, name))
        names.update(f.name for f in dataclasses.fields(cls))
        if title:
            out += ["", f"{title}:", ""]
        out += [_generated_from(module, name),
                "| setting | env | default | meaning |", "|---|---|---|---|"]
        out += settings_rows(cls, page)
    _check_notes("settings", names)
    return "\n".join(out)


# ----------------------------------------------------------------------- cli
def gen_cli(_arg: str, _page: str) -> str:
    module, name = SOURCES["cli"]
    return "\n".join([_generated_from(module, name), "::: mkdocs-click",
                      f"    :module: {module}", f"    :command: {name}",
                      "    :prog_name: celery -A proj zsched", "    :style: table",
                      "    :list_subcommands: true", "    :depth: 2"])


# ---------------------------------------------------------------- redis layout
_KEY_KINDS = {"Hash": "hash", "Sorted set": "zset", "String": "string", "Set": "set",
              "List": "list", "Capped stream": "stream", "Pub/sub channel": "pub/sub channel"}
_KIND = re.compile(r"^(" + "|".join(sorted(_KEY_KINDS, key=len, reverse=True)) + r")\b")


def key_entries() -> Iterator[tuple[str, str, str, str]]:
    """(attribute, key, kind, docstring) of every key ``Keys`` names, in its order."""
    cls = _load(SOURCES["keys"])
    keys = cls()
    for attr, member in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(member, property):
            key, doc = getattr(keys, attr), inspect.getdoc(member) or ""
        elif inspect.isfunction(member) and inspect.signature(member).return_annotation == "str":
            params = list(inspect.signature(member).parameters)[1:]
            key = member(keys, *(f"<{p}>" for p in params))
            doc = inspect.getdoc(member) or ""
        else:
            continue
        kind = _KIND.match(doc)
        if kind and doc[kind.end():].startswith((":", ", on the base prefix:")):
            doc = doc[kind.end():].lstrip(":, ")  # the type has a column of its own
        yield attr, key, _KEY_KINDS[kind.group(1)] if kind else "", doc.replace("->", "→")


def gen_keys(_arg: str, page: str) -> str:
    notes = _notes().get("keys", {})
    out = [_generated_from(*SOURCES["keys"]), "| key | type | content |", "|---|---|---|"]
    entries = list(key_entries())
    for attr, key, kind, doc in entries:
        content = _from_rst(doc, page)
        if notes.get(attr, {}).get("more"):
            content += " " + notes[attr]["more"]
        out.append(f"| `{key}` | {kind} | {_cell(content)} |")
    _check_notes("keys", {attr for attr, *_ in entries})
    return "\n".join(out)


def gen_state(_arg: str, page: str) -> str:
    notes = _notes().get("state", {})
    out = [_generated_from(*SOURCES["state"]), "| field | wire key | meaning |", "|---|---|---|"]
    described = _load(SOURCES["state"]).describe()
    for name, wire, doc in described:
        meaning = doc + (" " + notes[name]["more"] if notes.get(name, {}).get("more") else "")
        out.append(f"| `{name}` | `{wire}` | {_cell(_from_rst(meaning, page))} |")
    _check_notes("state", {name for name, *_ in described})
    return "\n".join(out)


# ------------------------------------------------------------------- openapi
@functools.cache
def openapi() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(OPENAPI.read_text("utf-8"))
    return document


def _schema_link(ref: str, page: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    here = "" if page.endswith("schemas.md") else "schemas.md"
    return f"[`{name}`]({here}#{name.lower()})"


def _type(schema: dict[str, Any], page: str) -> str:
    """A schema's type in a few words: a link for a reference, ``or`` for a union."""
    if "$ref" in schema:
        return _schema_link(schema["$ref"], page)
    if "anyOf" in schema:
        return " or ".join(_type(s, page) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        items = schema.get("items") or {}
        return f"array of {_type(items, page)}" if items else "array"
    return str(kind)


_LIMITS = {"minimum": ">= {}", "maximum": "<= {}", "exclusiveMinimum": "> {}",
           "exclusiveMaximum": "< {}", "minLength": "length >= {}", "maxLength": "length <= {}",
           "pattern": "pattern `{}`", "default": "default `{}`"}


def _limits(schema: dict[str, Any]) -> str:
    found: list[str] = []
    for part in [schema, *schema.get("anyOf", [])]:
        for key, words in _LIMITS.items():
            if key in part:
                value = json.dumps(part[key]) if key == "default" else part[key]
                found.append(words.format(value))
    return "; ".join(found)


def _describe(schema: dict[str, Any]) -> str:
    return " ".join(x for x in (_from_rst(schema.get("description", ""), ""),
                                _limits(schema)) if x)


def schema_table(schema: dict[str, Any], page: str) -> str:
    required = set(schema.get("required", []))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        rows.append(f"| `{name}` | {_cell(_type(prop, page))} | "
                    f"{'yes' if name in required else 'no'} | {_cell(_describe(prop))} |")
    if schema.get("additionalProperties") is False:
        rows.append("\nNo other field is accepted.")
    return "\n".join(rows)


def _parameters(op: dict[str, Any], page: str) -> list[str]:
    if not op.get("parameters"):
        return []
    rows = ["**Parameters**", "", "| name | in | type | required | description |",
            "|---|---|---|---|---|"]
    for p in op["parameters"]:
        rows.append(f"| `{p['name']}` | {p['in']} | {_cell(_type(p.get('schema', {}), page))} "
                    f"| {'yes' if p.get('required') else 'no'} | "
                    f"{_cell(_describe({**p.get('schema', {}), **p}))} |")
    return [*rows, ""]


def _body(op: dict[str, Any], page: str) -> list[str]:
    body = op.get("requestBody")
    if not body:
        return []
    out = [f"**Request body**{' (required)' if body.get('required') else ''}", ""]
    for media, content in body.get("content", {}).items():
        schema = content.get("schema", {})
        if "$ref" in schema or "properties" not in schema:
            out += [f"- `{media}`: {_type(schema, page)} {_describe(schema)}".rstrip(), ""]
        else:
            out += [f"`{media}`: {_from_rst(schema.get('description', ''), page)}", "",
                    schema_table(schema, page), ""]
    return out


def _responses(op: dict[str, Any], page: str) -> list[str]:
    rows = ["**Responses**", "", "| status | meaning | body | headers |", "|---|---|---|---|"]
    for status, answer in op.get("responses", {}).items():
        bodies = ", ".join(f"`{media}` {_type(c.get('schema', {}), page)}"
                           for media, c in answer.get("content", {}).items())
        headers = ", ".join(f"`{h}`" for h in answer.get("headers", {}))
        rows.append(f"| `{status}` | {_cell(_from_rst(answer.get('description', ''), page))} "
                    f"| {_cell(bodies)} | {headers} |")
    return [*rows, ""]


def gen_openapi(tag: str, page: str) -> str:
    """Every operation of one tag of the OpenAPI document, in its order."""
    out: list[str] = []
    for path, ops in openapi()["paths"].items():
        for method, op in ops.items():
            if tag not in op.get("tags", []):
                continue
            out += [f"## {op.get('summary', op['operationId'])}", "",
                    f"`{method.upper()} {path}`", "",
                    _from_rst(op.get("description", ""), page), ""]
            out += _parameters(op, page) + _body(op, page) + _responses(op, page)
    if not out:
        log.warning("the OpenAPI document has no operation tagged %r", tag)
    return "\n".join(out)


def gen_openapi_schemas(_arg: str, page: str) -> str:
    out: list[str] = []
    for name, schema in openapi()["components"]["schemas"].items():
        out += [f"## {name}", "", _from_rst(schema.get("description", ""), page), "",
                schema_table(schema, page), ""]
    for name, scheme in openapi()["components"].get("securitySchemes", {}).items():
        out += [f"## Security scheme `{name}`", "",
                f"HTTP `{scheme.get('scheme', '')}`: {scheme.get('description', '')}", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- architecture
@functools.cache
def pyproject() -> dict[str, Any]:
    loaded: dict[str, Any] = tomllib.loads(PYPROJECT.read_text("utf-8"))
    return loaded


def importlinter() -> dict[str, Any]:
    """``[tool.importlinter]`` of ``pyproject.toml``: the root package and the contracts."""
    found: dict[str, Any] = pyproject()["tool"]["importlinter"]
    return found


def layers_contract() -> dict[str, Any]:
    """The one ``layers`` contract (its ``containers``, its ``layers`` top first)."""
    found = [c for c in importlinter()["contracts"] if c["type"] == "layers"]
    assert len(found) == 1, "the page renders exactly one layers contract"
    return found[0]


def layers() -> list[tuple[list[str], bool]]:
    """The layers, bottom first: each one's names, and whether they are independent
    (``a | b``: they may not import each other) or not (``a : b``)."""
    out = []
    for layer in reversed(layers_contract()["layers"]):
        independent = ":" not in layer
        out.append(([n.strip() for n in re.split(r"[|:]", layer)], independent))
    return out


def _package_file(module: str) -> Path | None:
    base = PYPROJECT.parent.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def package_summary(module: str) -> str:
    """The first paragraph of ``module``'s docstring, read from its file (not imported)."""
    path = _package_file(module)
    if path is None:
        log.warning("architecture: the contract names %s, which does not exist", module)
        return ""
    doc = ast.get_docstring(ast.parse(path.read_text("utf-8"))) or ""
    summary = " ".join(doc.split("\n\n", 1)[0].split())
    if len(summary.split()) < 3:
        log.warning("architecture: %s has no docstring that says what it holds (%r)",
                    module, summary)
    return summary


def subpackages(module: str) -> list[str]:
    """The packages directly under ``module`` (``celery_zsched.contrib``: its ``django``)."""
    base = PYPROJECT.parent.joinpath(*module.split("."))
    if not base.is_dir():
        return []
    return [f"{module}.{d.name}" for d in sorted(base.iterdir())
            if (d / "__init__.py").is_file()]


def top_level() -> list[str]:
    """Every module and package directly under the root package (its ``__init__`` aside)."""
    root = importlinter()["root_package"]
    base = PYPROJECT.parent / root
    names = [p.stem for p in sorted(base.glob("*.py")) if p.stem != "__init__"]
    names += [d.name for d in sorted(base.iterdir()) if (d / "__init__.py").is_file()]
    return sorted(names)


def gen_layers(_arg: str, page: str) -> str:
    """The layers contract as a diagram and a table: bottom first, one row per package."""
    contract = layers_contract()
    (container,) = contract["containers"]
    steps = layers()
    named = {name for names, _ in steps for name in names}
    for missing in sorted(set(top_level()) - named):
        log.warning("architecture: %s.%s is in no layer of the contract", container, missing)
    diagram = " ← ".join(" / ".join(names) for names, _ in steps)
    out = [f"*Generated from `pyproject.toml`, the contract \"{contract['name']}\".*", "",
           "```text", diagram, "```", "",
           "| layer | package | what it holds |", "|---|---|---|"]
    for number, (names, independent) in enumerate(steps, 1):
        label = f"{number}" + {1: " (bottom)", len(steps): " (top)"}.get(number, "")
        if len(names) > 1:
            label += ", independent" if independent else ", may import each other"
        for name in names:
            for module in [f"{container}.{name}", *subpackages(f"{container}.{name}")]:
                shown = module.removeprefix(container + ".")
                out.append(f"| {label} | `{shown}` | "
                           f"{_cell(_from_rst(package_summary(module), page))} |")
                label = ""
    return "\n".join(out)


def _describe_contract(contract: dict[str, Any]) -> str:
    kind = contract["type"]
    if kind == "layers":
        return "the layers above, each importing only the ones below it"
    if kind == "forbidden":
        sources = ", ".join(f"`{m}`" for m in contract["source_modules"])
        banned = ", ".join(f"`{m}`" for m in contract["forbidden_modules"])
        how = ("directly" if contract.get("allow_indirect_imports") in (True, "true", "True")
               else "directly or through any other module of the package")
        return f"{sources} may not import {banned}, {how}"
    if kind == "independence":
        return ", ".join(f"`{m}`" for m in contract["modules"]) + " never import each other"
    if kind == "acyclic_siblings":
        roots = ", ".join(f"`{m}`" for m in contract["ancestors"])
        return f"no cycle among the modules of any package of {roots}"
    log.warning("architecture: contract type %r has no description in docs/_gen.py", kind)
    return kind


def gen_contracts(_arg: str, _page: str) -> str:
    """Every contract of ``[tool.importlinter]``: its name, type and what it forbids."""
    out = ["*Generated from `pyproject.toml` `[tool.importlinter]`.*", "",
           "| contract | type | what it keeps |", "|---|---|---|"]
    for contract in importlinter()["contracts"]:
        out.append(f"| {_cell(contract['name'])} | `{contract['type']}` | "
                   f"{_cell(_describe_contract(contract))} |")
    counted = ["imports inside functions"]
    if not importlinter().get("exclude_type_checking_imports"):
        counted.append("imports under `TYPE_CHECKING`")
    if importlinter().get("include_external_packages"):
        counted.append("imports of other distributions (`include_external_packages`)")
    out += ["", f"Every contract counts {', '.join(counted[:-1])} and {counted[-1]}."]
    return "\n".join(out)


def gen_entry_points(_arg: str, _page: str) -> str:
    """Every entry point the package registers, from ``pyproject.toml``."""
    out = ["*Generated from `pyproject.toml` `[project.entry-points]`.*", "",
           "| group | name | object |", "|---|---|---|"]
    for group, points in pyproject()["project"]["entry-points"].items():
        for name, target in points.items():
            out.append(f"| `{group}` | `{name}` | `{target}` |")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[str, str], str]] = {
    "settings": gen_settings, "cli": gen_cli, "keys": gen_keys, "state": gen_state,
    "openapi": gen_openapi, "openapi-schemas": gen_openapi_schemas,
    "layers": gen_layers, "contracts": gen_contracts, "entry-points": gen_entry_points,
}


def expand(markdown: str, page: str) -> str:
    """``markdown`` of the page at ``page`` (relative to docs/) with its markers filled in."""
    def fill(match: re.Match[str]) -> str:
        generate = GENERATORS.get(match.group("name"))
        if generate is None:
            log.warning("%s: unknown marker %s", page, match.group(0))
            return match.group(0)
        return generate(match.group("arg") or "", page)

    return _MARKER.sub(fill, markdown)


def page_source(page: str) -> str:
    """The Markdown MkDocs renders for ``page`` (relative to docs/), generated parts filled."""
    return expand((DOCS / page).read_text("utf-8"), page)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: fill in the generated parts of each page."""
    return expand(markdown, page.file.src_uri)


# ---------------------------------------------------------------- docstrings
def rst_to_markdown(text: str) -> str:
    """The reStructuredText of the package's docstrings as Markdown for mkdocstrings:
    ``:class:`~a.B``` as `` `B` ``, ``text::`` before a literal block as ``text:``."""
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`", r"`\1`", text)
    text = re.sub(r":\w+:`\.?([^`]+)`", r"`\1`", text)
    text = re.sub(r"\s*::$", ":", text, flags=re.M)
    return re.sub(r"^(\s*):$", r"\1", text, flags=re.M)


try:  # griffe comes with mkdocstrings (the docs extra); the tests need only the above
    import griffe
except ImportError:  # pragma: no cover
    griffe = None  # type: ignore[assignment]
else:
    class RstMarkup(griffe.Extension):
        """A griffe extension (``mkdocs.yml``): docstrings' RST markup as Markdown."""

        def on_instance(self, *, obj: Any, **_: Any) -> None:
            if obj.docstring is not None:
                obj.docstring.value = rst_to_markdown(obj.docstring.value)
