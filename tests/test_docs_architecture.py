"""The documentation follows the code's layout: the architecture page is the import-linter
contract of ``pyproject.toml`` (generated from it), and every module, file and script
the pages and the README name still exists where they say."""

from __future__ import annotations

import importlib
import logging
import re
from types import ModuleType

import pytest

from tests.docs_pages import DOCS, README, REPO, generator, page

ARCHITECTURE = "explanation/architecture.md"
PACKAGE = REPO / "celery_zsched"
LUA = PACKAGE / "store" / "lua"

#: ``celery_zsched.store.Store``, ``celery_zsched.worker.report``: a module, then attributes.
DOTTED = re.compile(r"\bcelery_zsched(?:\.[A-Za-z_]\w*)+")
#: ``celery_zsched/services/preview.py``, ``celery_zsched/store/lua/``.
FILE_PATH = re.compile(r"\bcelery_zsched(?:/[\w.-]+)+/?")
#: ``claim.lua``, ``store/lua/_prelude.lua``.
SCRIPT = re.compile(r"\b([\w/]*?)(\w+\.lua)\b")


def _texts() -> dict[str, str]:
    """Every Markdown page under docs/ as written (markers unexpanded), and the README."""
    found = {str(p.relative_to(REPO)): p.read_text("utf-8") for p in sorted(DOCS.rglob("*.md"))}
    found["README.md"] = README.read_text("utf-8")
    return found


def _mentions(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted({(m.group(0), where) for where, text in _texts().items()
                   for m in pattern.finditer(text)})


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        try:
            found: object = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the module exists but imports something missing
            continue
        for attribute in parts[end:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


#: Entry point groups look like module paths (``celery_zsched.extensions``) and are not.
_ENTRY_POINT_GROUPS = set(generator().pyproject()["project"]["entry-points"])


def _module_mentions() -> list[tuple[str, str]]:
    return [(dotted, where) for dotted, where in _mentions(DOTTED)
            if dotted not in _ENTRY_POINT_GROUPS]


@pytest.mark.parametrize(("dotted", "where"), _module_mentions())
def test_every_module_path_the_docs_name_imports(dotted: str, where: str) -> None:
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{where} names {dotted}, which does not resolve: {exc}")


def test_the_check_finds_the_public_paths_and_fails_a_missing_one() -> None:
    named = {dotted for dotted, _ in _module_mentions()}
    assert {"celery_zsched.worker", "celery_zsched.signals", "celery_zsched.errors",
            "celery_zsched.store.Store", "celery_zsched.config.Settings"} <= named
    assert not named & _ENTRY_POINT_GROUPS
    assert isinstance(resolve("celery_zsched.worker"), ModuleType)
    for missing in ("celery_zsched.no_such_module", "celery_zsched.store.NoSuchClass"):
        with pytest.raises(AttributeError):
            resolve(missing)


@pytest.mark.parametrize(("path", "where"), _mentions(FILE_PATH))
def test_every_file_path_the_docs_name_exists(path: str, where: str) -> None:
    assert (REPO / path.rstrip("/")).exists(), f"{where} names {path}, which does not exist"


def test_every_script_the_docs_name_exists() -> None:
    missing = [(m.group(0), where) for where, text in _texts().items()
               for m in SCRIPT.finditer(text) if not (LUA / m.group(2)).is_file()]
    assert not missing, missing


# ------------------------------------------------------------------ the contract
def test_the_contract_puts_every_package_in_a_layer() -> None:
    """A package the layers leave out would escape the contract: import-linter checks
    only the modules its layers name."""
    gen = generator()
    named = {name for names, _ in gen.layers() for name in names}
    assert set(gen.top_level()) <= named, set(gen.top_level()) - named
    assert "__init__" not in gen.top_level()
    assert {"core", "config", "store", "services", "beat", "worker", "cli"} <= named


def test_the_architecture_page_is_generated_from_the_contract(
        caplog: pytest.LogCaptureFixture) -> None:
    gen = generator()
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.zsched_gen"):
        rendered = page(ARCHITECTURE)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert "<!-- gen:" not in rendered
    # The diagram: every layer of the contract, bottom first.
    diagram = " ← ".join(" / ".join(names) for names, _ in gen.layers())
    assert f"\n{diagram}\n" in rendered
    assert diagram.startswith("core ← config ← store ← services ← ")
    # One row per package, with the first paragraph of its docstring.
    for names, _ in gen.layers():
        for name in names:
            assert f"| `{name}` |" in rendered, name
    assert "| `contrib.django` |" in rendered
    # Every contract, and every entry point.
    for contract in gen.importlinter()["contracts"]:
        assert contract["name"].replace("|", "\\|") in rendered, contract["name"]
    for group, points in gen.pyproject()["project"]["entry-points"].items():
        for name, target in points.items():
            assert f"| `{group}` | `{name}` | `{target}` |" in rendered


def test_a_package_outside_the_contract_or_without_a_docstring_warns(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = generator()
    packages = gen.top_level()
    monkeypatch.setattr(gen, "top_level", lambda: [*packages, "newpkg"])
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.zsched_gen"):
        gen.gen_layers("", ARCHITECTURE)
        gen.package_summary("celery_zsched.no_such_package")
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "celery_zsched.newpkg is in no layer" in messages
    assert "celery_zsched.no_such_package, which does not exist" in messages


def test_the_page_says_the_contract_is_the_source_of_truth_run_by_ci() -> None:
    text = (DOCS / ARCHITECTURE).read_text("utf-8")
    assert "source of truth" in text
    assert "`lint-imports` runs in `.ci/run`" in text
    assert re.search(r"^lint-imports$", (REPO / ".ci" / "run").read_text("utf-8"), re.M)


def test_the_named_interfaces_the_page_describes_exist() -> None:
    from celery_zsched.services import extensions, notices, signals, writer

    rendered = page(ARCHITECTURE)
    assert "celery_zsched.services.writer.JobWriter" in rendered
    assert {"create", "replace", "delete", "set_paused", "import_jobs"} <= set(
        vars(writer.JobWriter))
    groups = generator().pyproject()["project"]["entry-points"]
    for group in (extensions.EXTENSIONS, extensions.NOTIFY_TRANSPORTS):
        assert f"`{group}`" in rendered and group in groups
    assert hasattr(notices, "Transport") and hasattr(notices, "Message")
    assert "celery_zsched.services.signals" in rendered and signals.SIGNALS

