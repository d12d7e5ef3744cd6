"""vlrl.access: token files refused when missing, empty or world-readable; roles; identities."""

from __future__ import annotations

import pytest

from vlrl.access import Identities, Identity, identity_from_file, read_token_file
from vlrl.errors import VlrlError


def test_token_file_is_read_and_stripped(tmp_path):
    path = tmp_path / "a.token"
    path.write_text("  s3cret\n")
    path.chmod(0o600)
    assert read_token_file(path) == "s3cret"
    path.chmod(0o440)  # a Kubernetes Secret mounted for fsGroup: group-readable is allowed
    assert read_token_file(path) == "s3cret"


@pytest.mark.parametrize(
    "problem,expected",
    [
        ("missing", "does not exist"),
        ("empty", "is empty"),
        ("world-readable", "readable or writable by every user (mode 0644)"),
        ("world-writable", "readable or writable by every user (mode 0602)"),
        ("directory", "is not a regular file"),
        ("two words", "more than one word"),
    ],
)
def test_bad_token_files_are_one_clear_line(tmp_path, problem, expected):
    path = tmp_path / "x.token"
    if problem == "directory":
        path.mkdir()
    elif problem != "missing":
        path.write_text({"empty": "\n", "two words": "a b\n"}.get(problem, "token\n"))
        path.chmod({"world-readable": 0o644, "world-writable": 0o602}.get(problem, 0o600))
    with pytest.raises(VlrlError) as err:
        read_token_file(path)
    assert expected in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_identities_from_a_directory(tmp_path, access_dir):
    files = access_dir({"ann": "trainer", "bob": "approver"})
    ids = Identities.from_dir(tmp_path / "access")
    assert len(ids) == 2
    assert ids.identify(files["bob"].read_text().strip()) == Identity("bob", "approver")
    assert ids.identify("not-a-token") is None
    assert identity_from_file(tmp_path / "access", files["ann"]) == Identity("ann", "trainer")


def test_roles_are_ordered():
    trainer = Identity("ann", "trainer")
    assert trainer.may("viewer") and trainer.may("trainer") and not trainer.may("approver")
    with pytest.raises(
        VlrlError, match="identity ann \\(trainer\\) may not promote: that needs the role approver or higher"
    ):
        trainer.require("approver", "promote")
    assert Identity("root", "admin").may("approver")


@pytest.mark.parametrize(
    "change,expected",
    [
        ("token without role", "has no role: add `carl: viewer|trainer|approver|admin`"),
        ("role without token", "names dora but"),
        ("unknown role", "has role 'owner'"),
        ("same token", "have the same token"),
        ("world-readable token", "readable or writable by every user"),
    ],
)
def test_bad_access_directories_are_one_clear_line(tmp_path, access_dir, change, expected):
    directory = tmp_path / "access"
    files = access_dir({"ann": "trainer", "bob": "approver"})
    roles = directory / "roles.yaml"
    if change == "token without role":
        (directory / "carl.token").write_text("t\n")
        (directory / "carl.token").chmod(0o600)
    elif change == "role without token":
        roles.write_text(roles.read_text() + "dora: viewer\n")
    elif change == "unknown role":
        roles.write_text(roles.read_text() + "ann: owner\n")
    elif change == "same token":
        files["bob"].write_text(files["ann"].read_text())
    elif change == "world-readable token":
        files["bob"].chmod(0o644)
    with pytest.raises(VlrlError) as err:
        Identities.from_dir(directory)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_token_file_names_no_identity(tmp_path, access_dir):
    access_dir({"ann": "trainer"})
    stranger = access_dir({"eve": "admin"}, name="other")["eve"]
    with pytest.raises(VlrlError, match="belongs to no identity"):
        identity_from_file(tmp_path / "access", stranger)


def test_a_directory_may_hold_only_digests_as_sha256sum_prints_them(tmp_path, access_dir):
    import subprocess

    files = access_dir({"ann": "trainer", "bob": "approver"})
    directory = tmp_path / "access"
    for name, path in files.items():  # the documented command, run by the shell
        digest = subprocess.run(
            ["sh", "-c", f'printf %s "$(cat {path})" | sha256sum | cut -d" " -f1'],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (directory / f"{name}.sha256").write_text(digest)
        path.rename(tmp_path / path.name)  # the token leaves the shared directory with its owner
    ids = Identities.from_dir(directory)
    assert ids.identify((tmp_path / "bob.token").read_text().strip()) == Identity("bob", "approver")
    assert identity_from_file(directory, tmp_path / "ann.token") == Identity("ann", "trainer")
    (directory / "ann.sha256").write_text("not-a-digest\n")
    with pytest.raises(VlrlError, match="must hold the token's SHA-256 as 64 hex digits"):
        Identities.from_dir(directory)
    (directory / "ann.sha256").unlink()
    (tmp_path / "bob.token").rename(directory / "bob.token")
    with pytest.raises(VlrlError, match="identity bob has both"):
        Identities.from_dir(directory)
