"""The layout's dependency rules (issue 32), checked on the source: every import statement, including those inside
functions (an import moved into a function to dodge a cycle is still a dependency); imports under
`if TYPE_CHECKING:` are not, since they never run.

    bot.cli → bot.app → bot.slack | bot.discord → bot.chat → knowledge (public API) → knowledge.storage → db

KNOWN lists the violations that exist today, each with what removes it. A new violation fails the test, and so does
an entry that no longer applies (delete it: the list only shrinks)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("knowledge", "bot", "db")

# (rule, importer module, imported module) that exist today; remove an entry when its fix lands.
KNOWN: set[tuple[str, str, str]] = set()
# Modules of knowledge/ outside knowledge/storage that still run SQL themselves; fix: move it into knowledge/storage.
KNOWN_SQL: set[str] = set()
# What bot/ may import from knowledge/ besides its public API (`from knowledge import ...`), by package, and why.
BOT_MAY_IMPORT = {
    "knowledge.ingest": "the scheduler `ragbot run` starts, group refreshes, the file types `ragbot ingest` takes",
    "knowledge.eval": "`ragbot eval`",
    "knowledge.insights": "the gaps report's topic clustering (bot.chat.insights)",
    "knowledge.sources": "`ragbot source add`: the connector kinds and their settings",
    "knowledge.answer.generators.passages": "the terminal shows a hit's heading path as answers cite it",
    "knowledge.storage.identities": "bot state reads the identity map with the access resolver's own statement",
}
SQL_MODULES = ("sqlalchemy", "psycopg", "asyncpg", "pgvector")  # importing any of these means running SQL
SQL_ALLOWED = ("sqlalchemy.exc", "sqlalchemy.ext.asyncio")  # error types and engine handles may pass through


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path) -> set[str]:
    """Every module `module` imports at run time (a `from x import y` counts as x.y when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


MODULES = _modules()
GRAPH = {module: {i for i in _imports(module, path)} for module, path in MODULES.items()}


def _internal(imported: set[str]) -> set[str]:
    return {name for name in imported if name in MODULES}


def _violations() -> set[tuple[str, str, str]]:
    found = set()
    for module, imported in GRAPH.items():
        for target in _internal(imported):
            if module.startswith("knowledge") and target.startswith("bot"):
                found.add(("knowledge imports bot", module, target))
            if (target == "bot.cli" or target.startswith("bot.cli.")) and not module.startswith("bot.cli"):
                found.add(("imports bot.cli", module, target))
            if module.startswith("bot.chat") and target.split(".")[:2] in (["bot", "slack"], ["bot", "discord"],
                                                                          ["bot", "app"]):
                found.add(("bot.chat imports an adapter", module, target))
            if module.startswith(("bot.slack", "bot.discord")) and target.split(".")[:2] in (
                    ["bot", "slack"], ["bot", "discord"]) and target.split(".")[:2] != module.split(".")[:2]:
                found.add(("one adapter imports another", module, target))
            if module.startswith("knowledge.storage") and target.startswith("knowledge") and not target.startswith(
                    ("knowledge.storage", "knowledge.errors", "knowledge.access", "knowledge.settings")):
                found.add(("storage imports the stages above it", module, target))
    return found


def test_dependency_rules_hold() -> None:
    found = _violations()
    assert found - KNOWN == set(), f"new dependency violations: {sorted(found - KNOWN)}"
    assert KNOWN - found == set(), f"fixed, so delete from KNOWN: {sorted(KNOWN - found)}"


def test_sql_lives_in_knowledge_storage() -> None:
    """Outside knowledge/storage, no knowledge module imports a database driver or SQLAlchemy's SQL builders."""
    running_sql = set()
    for module, imported in GRAPH.items():
        if not module.startswith("knowledge") or module.startswith("knowledge.storage"):
            continue
        if any(name.startswith(SQL_MODULES) and not name.startswith(SQL_ALLOWED) for name in imported):
            running_sql.add(module)
    assert running_sql - KNOWN_SQL == set(), f"SQL outside knowledge/storage: {sorted(running_sql - KNOWN_SQL)}"
    assert KNOWN_SQL - running_sql == set(), f"fixed, so delete from KNOWN_SQL: {sorted(KNOWN_SQL - running_sql)}"


def test_bot_reaches_knowledge_through_its_public_api() -> None:
    """bot/ imports `knowledge` (its lazily loaded public API, knowledge/__init__.py) and only the few deeper
    packages BOT_MAY_IMPORT names."""
    deep = set()
    for module, imported in GRAPH.items():
        if not module.startswith("bot"):
            continue
        for target in _internal(imported):
            if target.startswith("knowledge.") and not target.startswith(tuple(BOT_MAY_IMPORT)):
                deep.add((module, target))
    assert not deep, f"bot/ imports knowledge internals (use `from knowledge import ...`): {sorted(deep)}"


def test_the_public_api_resolves_and_importing_it_is_cheap() -> None:
    """Every name knowledge/__init__.py exports resolves, and the `ragbot` CLI module (what `ragbot --help` loads)
    imports neither SQLAlchemy nor NumPy nor torch, nor the HTTP clients."""
    import knowledge

    assert knowledge.__all__ == sorted(knowledge._EXPORTS)
    for name in knowledge.__all__:
        assert getattr(knowledge, name) is not None, name
    probe = ("import sys, bot.cli, knowledge\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'numpy', 'torch', 'psycopg', 'anthropic', 'httpx'}))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.strip()
    assert loaded == "[]"


def _package(module: str) -> str:
    """The unit the no-cycles rule is about: knowledge.<stage>, bot.<part>, db (top-level modules are their own)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_cycles_between_packages() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, imported in GRAPH.items():
        for target in _internal(imported):
            a, b = _package(module), _package(target)
            if a != b and (a, b) not in _KNOWN_EDGES:
                edges[a].add(b)
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(list(edges)):
        if node not in state:
            walk(node)
    assert not cycles, f"import cycles between packages: {cycles}"


# Edges of the KNOWN violations above, left out of the cycle check until they are fixed.
_KNOWN_EDGES = {(_package(a), _package(b)) for _, a, b in KNOWN}


def test_the_rules_can_fail() -> None:
    """The checker sees a function-level import and ignores a TYPE_CHECKING one (a test that cannot fail is a
    defect)."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bot.app import BotApp\n"
              "def f():\n    from bot.cli.main import app\n")
    path = REPO / "tests" / "_architecture_probe.py"
    path.write_text(source, encoding="utf-8")
    try:
        imported = _imports("knowledge.probe", path)
    finally:
        path.unlink()
    assert "bot.cli.main" in imported and "bot.app" not in imported


# ---- no core module names a platform (issue 42) ----------------------------------------------------------------------
# The chat core and the knowledge side work for any registered platform (bot.platforms); a platform is one package
# (bot/slack, bot/discord, bot/teams, or a third-party one through the `ragbot.platforms` entry points). So the core's
# CODE may not name one: no string literal (f-string parts included) and no identifier (names, attributes, functions,
# classes, arguments, keywords, imports) containing a platform's name. Docstrings and comments are prose: they may
# name a platform as an example ("a chat identity such as `slack:U1`"); they are not what runs.
PLATFORM_WORDS = ("slack", "discord", "teams")
CORE_PATHS = ("knowledge", "bot/chat", "bot/app.py", "bot/settings.py", "bot/server.py", "bot/web")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (first statement of a module, class or function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                found.add(id(first.value))
    return found


def _names_of(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return []


def platform_mentions(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal or identifier in `source` naming a platform, docstrings excepted."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        texts = _names_of(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts.append(node.value)
        for text in texts:
            if any(word in text.lower() for word in PLATFORM_WORDS):
                found.append((getattr(node, "lineno", 0), text if len(text) < 80 else text[:77] + "..."))
    return found


def _core_files() -> list[Path]:
    files: list[Path] = []
    for part in CORE_PATHS:
        path = REPO / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_no_core_module_names_a_platform() -> None:
    named = {f"{path.relative_to(REPO)}:{line}": text for path in _core_files()
             for line, text in platform_mentions(path.read_text(encoding="utf-8"))}
    assert not named, f"core modules naming a chat platform (iterate bot.platforms instead): {named}"


def test_the_platform_check_can_fail() -> None:
    """Each kind of mention is caught; a docstring or a comment is not one."""
    source = ('"""Answers Slack and Discord alike."""\n'
              'import bot.slack.adapter  # Slack\n'
              'from bot.discord import PLATFORM\n'
              'KINDS = ("slack", "discord")\n'
              'def f(teams_id):\n    """For Teams."""\n    return settings.slack_bot_token, f"{x}:discord:{y}"\n'
              'g(discord_token=1)\nclass SlackReply: pass\n')
    found = [text for _, text in platform_mentions(source)]
    assert found.count("slack") == 1 and found.count("discord") == 1
    assert {"bot.slack.adapter", "bot.discord", "teams_id", "slack_bot_token", ":discord:", "discord_token",
            "SlackReply"} <= set(found)
    assert not any("Slack and Discord" in text or "For Teams" in text for text in found)
