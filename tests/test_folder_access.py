"""Folder sources fail closed: symbolic links, broken or malformed `.access` files, moves, odd names, unreadable
folders. Each case is checked by what an asker can find and what the sync report says."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import write
from sqlalchemy import text

from knowledge.search.retrieval import SearchFilters
from knowledge.sources.base import ItemRef, SourceItem, StaticSource
from knowledge.sources.folder import FolderSource, intersect_access, parse_access_lines

SECRET = "# Salary bands\n\nBand L3 pays 150k. The vault codeword is zebrafinch.\n"
PUBLIC = "# Handbook\n\nThe office opens at eight and the kitchen closes at six.\n"


async def access_of(kb) -> dict[str, tuple[str, ...]]:  # type: ignore[no-untyped-def]
    """Every indexed document's access list, and (checked) every chunk carries the same one."""
    async with kb.engine.connect() as conn:
        rows = (await conn.execute(text(
            "SELECT d.external_id, d.access, array_agg(DISTINCT array_to_string(c.access, ',')) AS chunk_access "
            "FROM documents d JOIN chunks c ON c.document_id = d.id GROUP BY d.external_id, d.access"))).all()
    for row in rows:
        assert row.chunk_access == [",".join(row.access)], row
    return {r.external_id: tuple(r.access) for r in rows}


async def finds(kb, query: str, principals=("everyone",)) -> set[str]:  # type: ignore[no-untyped-def]
    """Documents found whose text holds the query's last word (the distinctive one in these tests)."""
    hits = (await kb.search(query, SearchFilters(tuple(principals)), k=10)).hits
    return {h.external_id for h in hits if query.split()[-1] in h.text}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "wiki"
    write(root, "public/handbook.md", PUBLIC)
    write(root, "hr/.access", "group:hr\n")
    write(root, "hr/salaries.md", SECRET)
    write(root, "eng/.access", "group:eng\n")
    write(root, "eng/build.md", "# Build\n\nRun make to build the service.\n")
    return root


# --- symbolic links -------------------------------------------------------------------------------------------

async def test_a_link_in_a_public_folder_to_a_restricted_file_keeps_the_restriction(fresh_kb, tree):
    (tree / "public" / "salaries.md").symlink_to(tree / "hr" / "salaries.md")
    report = await fresh_kb.sync(FolderSource(tree))
    access = await access_of(fresh_kb)
    assert access["public/salaries.md"] == ("group:hr",)  # the stricter of public (everyone) and hr
    assert access["hr/salaries.md"] == ("group:hr",)
    assert await finds(fresh_kb, "vault codeword zebrafinch") == set()
    assert await finds(fresh_kb, "vault codeword zebrafinch", ["group:hr"])
    assert not report.failed


async def test_a_linked_folder_takes_the_stricter_access_of_both_places(fresh_kb, tree):
    (tree / "public" / "hr-mirror").symlink_to(tree / "hr", target_is_directory=True)
    # A link from the eng folder to the hr file: nobody is in both lists for sure, so nobody may see it.
    (tree / "eng" / "salaries.md").symlink_to(tree / "hr" / "salaries.md")
    await fresh_kb.sync(FolderSource(tree))
    access = await access_of(fresh_kb)
    assert access["public/hr-mirror/salaries.md"] == ("group:hr",)
    assert access["eng/salaries.md"] == ()
    assert await finds(fresh_kb, "vault codeword zebrafinch") == set()
    assert "eng/salaries.md" not in await finds(fresh_kb, "vault codeword zebrafinch", ["group:eng"])


async def test_links_leaving_the_root_dangling_looping_or_hidden_are_skipped_and_reported(fresh_kb, tree, tmp_path):
    outside = write(tmp_path / "elsewhere", "secret.md", SECRET)
    write(tree, ".private/notes.md", SECRET)
    (tree / "public" / "outside.md").symlink_to(outside)
    (tree / "public" / "outside-folder").symlink_to(outside.parent, target_is_directory=True)
    (tree / "public" / "dangling.md").symlink_to(tree / "nowhere.md")
    (tree / "public" / "loop").symlink_to(tree, target_is_directory=True)
    (tree / "public" / "hidden.md").symlink_to(tree / ".private" / "notes.md")
    (tree / "public" / "self.md").symlink_to(tree / "public" / "self.md")  # a link to itself
    report = await fresh_kb.sync(FolderSource(tree))
    assert sorted(report.added) == ["eng/build.md", "hr/salaries.md", "public/handbook.md"]
    warnings = "\n".join(report.warnings)
    assert "public/outside.md: a symbolic link to outside the source folder" in warnings
    assert "public/outside-folder: a symbolic link to outside the source folder" in warnings
    assert "public/dangling.md: a broken symbolic link" in warnings
    assert "public/loop: a symbolic link to a folder that contains it" in warnings
    assert "public/hidden.md: a symbolic link to a hidden file" in warnings
    assert "public/self.md: a broken symbolic link" in warnings
    assert await finds(fresh_kb, "vault codeword zebrafinch") == set()


async def test_a_link_indexed_before_loses_its_copy_once_it_points_outside(fresh_kb, tree, tmp_path):
    link = tree / "public" / "notes.md"
    link.symlink_to(tree / "public" / "handbook.md")
    await fresh_kb.sync(FolderSource(tree))
    assert "public/notes.md" in await access_of(fresh_kb)
    link.unlink()
    link.symlink_to(write(tmp_path / "elsewhere", "secret.md", SECRET))
    report = await fresh_kb.sync(FolderSource(tree))
    assert report.deleted == ["public/notes.md"]


# --- .access files --------------------------------------------------------------------------------------------

def _dangling(path: Path) -> None:
    path.symlink_to(path.parent / "gone")


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)  # reading it would block forever


UNUSABLE_ACCESS_FILES = {
    "dangling-link": (_dangling, "cannot be read"),
    "directory": (_directory, "is not a regular file"),
    "fifo": (_fifo, "is not a regular file"),
    "not-utf8": (lambda p: p.write_bytes(b"group:hr\n\xff\xfe\n"), "is not UTF-8 text"),
    "space-in-principal": (lambda p: p.write_text("group:hr\ngroup finance\n"), "line 2 is not a principal"),
    "no-kind": (lambda p: p.write_text("hr\n"), "line 1 is not a principal"),
    "inline-comment": (lambda p: p.write_text("group:hr  # the HR team\n"), "line 1 is not a principal"),
    "huge": (lambda p: p.write_bytes(b"group:hr\n" * 10_000), "is larger than 64 KB"),
    # Issue 30: a NUL used to reach Postgres as part of a principal and fail the document itself.
    "nul-byte": (lambda p: p.write_bytes(b"group:hr\x00\n"), "contains a NUL byte"),
    "nul-only": (lambda p: p.write_bytes(b"\x00"), "contains a NUL byte"),
    "control-character": (lambda p: p.write_bytes(b"group:hr\x01x\n"), "line 1 is not a principal"),
}


async def test_an_unusable_access_file_means_nobody_and_is_reported(fresh_kb, tree):
    for name, (make_access, _) in UNUSABLE_ACCESS_FILES.items():
        write(tree, f"{name}/salaries.md", SECRET.replace("zebrafinch", f"zebrafinch {name}"))
        make_access(tree / name / ".access")
    report = await fresh_kb.sync(FolderSource(tree))
    assert len(report.added) == 3 + len(UNUSABLE_ACCESS_FILES)  # nothing aborted the sync
    assert report.failed == []  # the access file is reported, not the document
    access = await access_of(fresh_kb)
    for name, (_, problem) in UNUSABLE_ACCESS_FILES.items():
        assert access[f"{name}/salaries.md"] == (), name
        assert any(f"{name}/.access {problem}" in w and "nobody may see" in w for w in report.warnings), name
    for principals in (["everyone"], ["group:hr"], ["group:hr", "group:finance", "user:a@example.com"]):
        assert await finds(fresh_kb, "vault codeword zebrafinch", principals) <= {"hr/salaries.md"}
    assert await finds(fresh_kb, "vault codeword zebrafinch", ["group:hr"]) == {"hr/salaries.md"}


async def test_a_byte_order_mark_does_not_eat_the_first_principal(fresh_kb, tree):
    (tree / "hr" / ".access").write_bytes("\ufeffgroup:hr\r\ngroup:finance\r\n".encode("utf-8"))
    report = await fresh_kb.sync(FolderSource(tree))
    assert (await access_of(fresh_kb))["hr/salaries.md"] == ("group:hr", "group:finance")
    assert await finds(fresh_kb, "vault codeword zebrafinch", ["group:hr"])
    assert report.warnings == []


def test_access_rules_in_isolation():
    assert parse_access_lines("# comment\n\neveryone\n").principals == ("everyone",)
    assert parse_access_lines("user:alice@example.com\ndomain:example.com\n").principals == (
        "user:alice@example.com", "domain:example.com")
    assert parse_access_lines("").principals == () and parse_access_lines("").problem is None
    assert parse_access_lines("Everyone\n").problem  # not a principal ragbot knows: fail closed
    assert intersect_access(("everyone",), ("group:hr",)) == ("group:hr",)
    assert intersect_access(("group:hr", "group:eng"), ("group:eng",)) == ("group:eng",)
    assert intersect_access(("group:hr",), ("user:alice@example.com",)) == ()


# --- moves ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sync_only", ["destination-folder", "destination-file"])
async def test_a_file_moved_into_a_restricted_folder_stops_being_public_after_syncing_only_the_destination(
    fresh_kb, tree, sync_only
):
    write(tree, "public/plan.md", "# Reorg plan\n\nThe reorg moves the platform team under finance in March.\n")
    await fresh_kb.sync(FolderSource(tree))
    assert "public/plan.md" in await finds(fresh_kb, "platform team reorg")
    (tree / "public" / "plan.md").rename(tree / "hr" / "plan.md")
    target = tree / "hr" if sync_only == "destination-folder" else tree / "hr" / "plan.md"
    report = await fresh_kb.sync(await fresh_kb.folder_source(target))
    assert report.added == ["hr/plan.md"]
    assert report.deleted == ["public/plan.md"]
    assert await finds(fresh_kb, "platform team reorg") == set()
    assert await finds(fresh_kb, "platform team reorg", ["group:hr"]) == {"hr/plan.md"}
    # Documents outside the synced part that still exist are untouched.
    assert set(await access_of(fresh_kb)) == {"public/handbook.md", "hr/salaries.md", "hr/plan.md", "eng/build.md"}


# --- names and unreadable folders -----------------------------------------------------------------------------

async def test_file_and_folder_names_that_are_not_utf8_never_stop_the_sync(fresh_kb, tmp_path):
    root = tmp_path / "odd"
    write(root, "fine.md", PUBLIC)
    bad_folder = root / os.fsdecode(b"caf\xe9")
    write(bad_folder, "menu.txt", "The lunch menu changes every Monday.")
    write(root, os.fsdecode(b"notes-\xff.txt"), "Plain text whose title comes from an undecodable file name.")
    write(root, os.fsdecode(b"notes-\xfe.txt"), "A second such file, which must not collide with the first.")
    report = await fresh_kb.sync(FolderSource(root))
    assert report.failed == []
    assert sorted(report.added) == ["caf\\xe9/menu.txt", "fine.md", "notes-\\xfe.txt", "notes-\\xff.txt"]
    hits = (await fresh_kb.search("lunch menu Monday", SearchFilters(), k=1)).hits
    assert hits[0].external_id == "caf\\xe9/menu.txt"
    again = await fresh_kb.sync(FolderSource(root))
    assert again.unchanged == 4 and again.deleted == []


class _Listed(StaticSource):
    """A folder listing made by another (unprivileged) process, replayed to the indexer: its items, its warnings and
    the parts it could not list; the listing is the inventory when the folder source's would be."""

    def __init__(self, source: FolderSource, listing: dict) -> None:  # type: ignore[type-arg]
        items = [SourceItem(external_id=e, filename=Path(e).name, read=(source.root / e).read_bytes, access=tuple(a))
                 for e, a in listing["items"]]
        super().__init__(source.spec, items, source.listing_prefix)
        self.complete_listing = source.complete_listing
        self.warnings, self.unlisted_prefixes = listing["warnings"], listing["unlisted"]

    async def inventory(self) -> list[ItemRef] | None:
        return await super().inventory() if self.complete_listing else None


def list_unprivileged(source: FolderSource) -> _Listed | FolderSource:
    """As root, permissions do not stop reading: list in a child process running as `nobody`."""
    if os.geteuid() != 0:
        return source
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            items = [(i.external_id, list(i.access)) for i in source.items()]
            payload = json.dumps({"items": items, "warnings": source.warnings, "unlisted": source.unlisted_prefixes})
            with os.fdopen(write_end, "w") as out:
                out.write(payload)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as incoming:
        listing = json.loads(incoming.read())
    os.waitpid(pid, 0)
    return _Listed(source, listing)


@pytest.fixture
def shared_tree():  # type: ignore[no-untyped-def]
    """A tree the unprivileged lister can reach (pytest's tmp_path is private to its user)."""
    root = Path(tempfile.mkdtemp(prefix="ragbot-acl-"))
    root.chmod(0o755)
    yield root / "wiki"
    for path in root.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(root)


async def test_an_unreadable_folder_keeps_what_was_indexed_under_it_and_is_reported(fresh_kb, shared_tree):
    write(shared_tree, "public/handbook.md", PUBLIC)
    write(shared_tree, "team/plans.md", "# Plans\n\nThe roadmap is reviewed every quarter.\n")
    write(shared_tree, "gone.md", "# Old\n\nAn old note about the printer.\n")
    for path in [shared_tree, *shared_tree.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    await fresh_kb.sync(FolderSource(shared_tree))
    (shared_tree / "team").chmod(0o000)
    (shared_tree / "gone.md").unlink()
    report = await fresh_kb.sync(list_unprivileged(FolderSource(shared_tree)))
    assert report.deleted == ["gone.md"]  # deletions elsewhere still happen
    assert any(w.startswith("could not list team/") for w in report.warnings), report.warnings
    assert "team/plans.md" in await access_of(fresh_kb)


async def test_an_unreadable_access_file_means_nobody(fresh_kb, shared_tree):
    write(shared_tree, "hr/salaries.md", SECRET)
    write(shared_tree, "hr/.access", "group:hr\n")
    for path in [shared_tree, *shared_tree.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (shared_tree / "hr" / ".access").chmod(0o000)
    report = await fresh_kb.sync(list_unprivileged(FolderSource(shared_tree)))
    assert report.added == ["hr/salaries.md"]
    assert (await access_of(fresh_kb))["hr/salaries.md"] == ()
    assert any("hr/.access cannot be read" in w for w in report.warnings), report.warnings


async def chunks_of(kb, external_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    async with kb.engine.connect() as conn:
        return list((await conn.execute(text(
            "SELECT c.text FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.external_id = :e "
            "ORDER BY c.ordinal"), {"e": external_id})).scalars())


# --- a link retargeted to a decoy of the same size and mtime (issue 30) -----------------------------------------

STRATEGY = "# Strategy\n\nWe acquire Northwind in Q3; the codename is kingfisher.\n"
DECOY = "# Strategy\n\nOur plans are shared at the all-hands meeting each quarter.\n"


def _decoy_like(path: Path, original: Path, content: str) -> Path:
    """A public file with the same size and mtime as `original` (`touch -r`), so only its identity differs."""
    content = content[: len(original.read_bytes())].ljust(len(original.read_bytes()), ".")
    write(path.parent, path.name, content)
    stat = original.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == original.stat().st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    return path


async def test_a_link_retargeted_to_a_same_size_same_mtime_decoy_is_read_again_with_its_new_access(fresh_kb, tree):
    write(tree, "hr/strategy.md", STRATEGY)
    link = tree / "public" / "plan.md"
    link.symlink_to(Path("../hr/strategy.md"))
    await fresh_kb.sync(FolderSource(tree))
    assert (await access_of(fresh_kb))["public/plan.md"] == ("group:hr",)
    assert await finds(fresh_kb, "acquire Northwind codename kingfisher") == set()

    decoy = _decoy_like(tree / "public" / "decoy.md", tree / "hr" / "strategy.md", DECOY)
    link.unlink()
    link.symlink_to(Path("decoy.md"))
    report = await fresh_kb.sync(FolderSource(tree))
    assert "public/plan.md" in report.updated  # re-read, not a metadata-only change
    assert (await access_of(fresh_kb))["public/plan.md"] == ("everyone",)
    assert await finds(fresh_kb, "acquire Northwind codename kingfisher") == set()  # the HR text left with its access
    assert "all-hands" in " ".join(await chunks_of(fresh_kb, "public/plan.md"))
    assert decoy.exists()


async def test_a_linked_folder_retargeted_to_a_same_shape_decoy_folder_is_read_again(fresh_kb, tree):
    write(tree, "hr/strategy.md", STRATEGY)
    mirror = tree / "public" / "mirror"
    mirror.symlink_to(Path("../hr"), target_is_directory=True)
    await fresh_kb.sync(FolderSource(tree))
    assert (await access_of(fresh_kb))["public/mirror/strategy.md"] == ("group:hr",)

    _decoy_like(tree / "public" / "decoys" / "strategy.md", tree / "hr" / "strategy.md", DECOY)
    _decoy_like(tree / "public" / "decoys" / "salaries.md", tree / "hr" / "salaries.md", PUBLIC)
    mirror.unlink()
    mirror.symlink_to(Path("decoys"), target_is_directory=True)
    await fresh_kb.sync(FolderSource(tree))
    assert (await access_of(fresh_kb))["public/mirror/strategy.md"] == ("everyone",)
    assert await finds(fresh_kb, "acquire Northwind codename kingfisher") == set()
    assert await finds(fresh_kb, "vault codeword zebrafinch") == set()


async def test_a_file_replaced_by_a_same_size_same_mtime_file_is_read_again(fresh_kb, tree):
    """No link at all: `mv` of a same-size file with `touch -r` over an indexed one changes only its inode."""
    plan = write(tree, "public/plan.md", DECOY)
    await fresh_kb.sync(FolderSource(tree))
    replacement = _decoy_like(tree / "public" / ".incoming", plan, "# Plan\n\nThe picnic moves to the riverside park.")
    os.replace(replacement, plan)
    report = await fresh_kb.sync(FolderSource(tree))
    assert report.updated == ["public/plan.md"]
    assert "riverside park" in " ".join(await chunks_of(fresh_kb, "public/plan.md"))


async def test_a_hard_link_in_a_public_folder_to_a_restricted_file_keeps_the_restriction(fresh_kb, tree):
    os.link(tree / "hr" / "salaries.md", tree / "public" / "salaries.md")
    await fresh_kb.sync(FolderSource(tree))
    access = await access_of(fresh_kb)
    assert access["public/salaries.md"] == access["hr/salaries.md"] == ("group:hr",)
    assert await finds(fresh_kb, "vault codeword zebrafinch") == set()


async def test_a_link_retargeted_between_listing_and_reading_is_not_read(fresh_kb, tree):
    write(tree, "hr/strategy.md", STRATEGY)
    _decoy_like(tree / "public" / "decoy.md", tree / "hr" / "strategy.md", DECOY)
    link = tree / "public" / "plan.md"
    link.symlink_to(Path("decoy.md"))
    source = FolderSource(tree)
    item = next(i for i in source.items() if i.external_id == "public/plan.md")
    assert item.access == ("everyone",)
    link.unlink()
    link.symlink_to(Path("../hr/strategy.md"))  # the listed access (everyone) must not get the HR bytes
    assert b"kingfisher" not in item.read()  # still the listed file: the resolved decoy
    os.replace(tree / "hr" / "strategy.md", tree / "public" / "decoy.md")  # now the listed path holds another file
    from knowledge.errors import ItemUnavailable
    with pytest.raises(ItemUnavailable, match="changed between listing and reading"):
        item.read()
