"""The cache trusts only folders and files this user owns and no one else can write: anything else is
refused with a warning naming it, and kiln builds in a private folder instead. Writes never follow a
planted symlink. (The tests run as root, so another user's file is made with os.chown.)"""
from __future__ import annotations

import json
import os
import warnings

import pytest

from kiln.runtime import cache
from kiln.runtime.private_files import KilnCacheWarning, PrivateTree, file_digest, manifest_path, write_atomic
from support.cache import OTHER_UID, answer, answer_source, library_path


def _plant_library(root, source, returning: int):
    """Put at `source`'s cache path a library returning `returning`, with a manifest that matches it."""
    planted = cache.load(answer_source(returning))  # built (in this cache) by the real compiler
    lib = library_path(root, source)
    lib.parent.mkdir(parents=True, exist_ok=True)
    os.link(planted._name, lib)
    size, digest = file_digest(lib)
    manifest_path(lib).write_text(json.dumps({"size": size, "sha256": digest}))
    return lib


@pytest.mark.parametrize("make_unsafe", ["other_owner", "world_writable", "group_writable", "symlink"])
def test_unsafe_cache_root_is_refused_for_a_private_folder(tmp_path, make_unsafe):
    root = tmp_path / "shared"
    if make_unsafe == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "elsewhere")
    else:
        root.mkdir(mode=0o700)
        {"other_owner": lambda: os.chown(root, OTHER_UID, OTHER_UID),
         "world_writable": lambda: root.chmod(0o777), "group_writable": lambda: root.chmod(0o770)}[make_unsafe]()
    tree = PrivateTree("cache")
    with pytest.warns(KilnCacheWarning, match=str(root)):
        used = tree.folder(root, "cpp", "ab")
    assert not str(used).startswith(str(root)) and used.is_dir()
    assert (used.stat().st_mode & 0o777) == 0o700 and used.stat().st_uid == os.geteuid()
    refused = tmp_path / "elsewhere" if make_unsafe == "symlink" else root
    assert list(refused.iterdir()) == [], "nothing is written into a refused folder"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per refused folder, not one per use
        assert tree.folder(root, "cpp", "ab") == used


def test_created_folders_are_private(fresh_cache):
    lib = cache.build(answer_source(1))
    for folder in (fresh_cache, fresh_cache / "cpp", lib.parent):
        assert folder.stat().st_mode & 0o777 == 0o700


def test_planted_library_of_another_user_is_not_loaded(fresh_cache):
    """A library at the predictable path, with a matching manifest, but owned by another user: rebuilt."""
    source = answer_source(42)
    lib = _plant_library(fresh_cache, source, 666)
    os.chown(lib, OTHER_UID, OTHER_UID)
    assert answer(cache.load(source)) == 42
    assert lib.stat().st_uid == os.geteuid()


def test_planted_library_without_a_manifest_is_not_loaded(fresh_cache):
    source = answer_source(42)
    lib = _plant_library(fresh_cache, source, 666)
    manifest_path(lib).unlink()
    assert answer(cache.load(source)) == 42


def test_subfolder_of_another_user_is_refused(fresh_cache):
    """`mkdir(exist_ok=True)` would accept a folder another user made and filled: kiln builds elsewhere."""
    source = answer_source(42)
    planted = library_path(fresh_cache, source).parent
    planted.mkdir(parents=True, mode=0o700)
    fresh_cache.chmod(0o700)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.warns(KilnCacheWarning, match=str(planted)):
        lib = cache.load(source)
    assert answer(lib) == 42
    assert list(planted.iterdir()) == []


def test_symlink_at_the_source_path_is_replaced_not_followed(fresh_cache, tmp_path):
    """Someone with a way into the folder links the published source path to a file of the victim's."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    source = answer_source(42)
    cpp = library_path(fresh_cache, source).with_suffix(".cpp")
    cpp.parent.mkdir(parents=True, mode=0o700)
    cpp.symlink_to(victim)
    assert answer(cache.load(source)) == 42
    assert victim.read_text() == "precious\n"
    assert not cpp.is_symlink() and cpp.read_text() == source


def test_write_atomic_replaces_a_symlink_and_never_opens_an_existing_temp_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "out.txt"
    target.symlink_to(victim)
    write_atomic(target, "new\n")
    assert victim.read_text() == "precious\n" and target.read_text() == "new\n" and not target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim.txt"]
