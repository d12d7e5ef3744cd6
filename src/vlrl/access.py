"""Identities and roles: who may register, promote, roll back and change what an endpoint serves.

An identity is a name, a role and a secret token. They live in one directory (a mounted
Kubernetes Secret, or a folder on a workstation):

    access/
      alice.token     the token of identity `alice` (one line; mode 0600 or 0400/0440)
      bob.sha256      or only its SHA-256 (64 hex digits): the directory then holds no secret
      roles.yaml      alice: trainer
                      bob: approver

A caller presents a token (a Bearer header to the endpoint, `--identity-file` to the registry);
the token names the identity, the identity's role says what it may do. Roles are ordered, each
includes the rights of the ones before it:

    viewer    read: status, routes, metrics, history; query the served models
    trainer   + register adapters in the registry
    approver  + promote and roll back registry versions; swap, roll back, load, unload adapters
    admin     + everything else (any other mutating path of the server; the single-key mode)

Tokens are compared by SHA-256, so a shared access directory (the registry's, read by every
user of the registry) should hold `NAME.sha256` files, and each token stays with its owner:
`printf %s "$(cat alice.token)" | sha256sum | cut -d' ' -f1 > access/alice.sha256`.

Token files are checked like SSH keys: a missing, empty, or world-readable/writable file is
refused with one line. Group-readable is allowed, because Kubernetes mounts a Secret as
root:<fsGroup> 0440 for a non-root pod. What this protects, and what not: docs/security.md.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import yaml

from vlrl.errors import VlrlError

ROLES = ("viewer", "trainer", "approver", "admin")  # each includes the rights of the ones before it
TOKEN_SUFFIX = ".token"
DIGEST_SUFFIX = ".sha256"
ROLES_FILE = "roles.yaml"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")


@dataclass(frozen=True)
class Identity:
    """Who acts, and with which role."""

    name: str
    role: str

    def may(self, needed: str) -> bool:
        """Whether this identity's role includes `needed`."""
        return ROLES.index(self.role) >= ROLES.index(needed)

    def require(self, needed: str, action: str) -> None:
        """VlrlError naming identity, role and the role `action` needs, unless allowed."""
        if not self.may(needed):
            raise VlrlError(
                f"identity {self.name} ({self.role}) may not {action}: that needs the role {needed} or higher"
            )


def read_token_file(path: str | Path) -> str:
    """The token in `path` (stripped), refusing a missing, empty or world-accessible file."""
    path = Path(path)
    try:
        mode = path.stat().st_mode  # follows links: Kubernetes mounts Secret keys as symlinks
    except FileNotFoundError:
        raise VlrlError(f"token file {path} does not exist") from None
    except OSError as exc:
        raise VlrlError(f"cannot read token file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise VlrlError(f"token file {path} is not a regular file")
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise VlrlError(
            f"token file {path} is readable or writable by every user (mode {stat.S_IMODE(mode):04o}); "
            f"run `chmod 600 {path}` and replace the token, it may have been read"
        )
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise VlrlError(f"cannot read token file {path}: {exc}") from None
    if not token:
        raise VlrlError(f"token file {path} is empty; write the identity's token into it")
    if any(c.isspace() for c in token):
        raise VlrlError(f"token file {path} holds more than one word; a token is one line without spaces")
    return token


def new_token() -> str:
    """A fresh random token (64 hex digits)."""
    return secrets.token_hex(32)


def _digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


def read_digest_file(path: Path) -> bytes:
    """The SHA-256 in a NAME.sha256 file (64 hex digits, as `sha256sum` prints it)."""
    try:
        text = path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError) as exc:
        raise VlrlError(f"cannot read {path}: {exc}") from None
    if not text or not re.fullmatch(r"[0-9a-fA-F]{64}", text[0]):
        raise VlrlError(
            f'{path} must hold the token\'s SHA-256 as 64 hex digits (printf %s "$(cat NAME.token)" | sha256sum)'
        )
    return bytes.fromhex(text[0])


def read_roles(path: str | Path) -> dict[str, str]:
    """roles.yaml: {identity: role}; unknown roles and bad names are one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise VlrlError(f"roles file {path} does not exist; it maps each identity to one of {', '.join(ROLES)}")
    try:
        roles = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise VlrlError(f"roles file {path} is not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(roles, dict) or not roles:
        raise VlrlError(f"roles file {path} must map identity names to roles, e.g. `alice: trainer`")
    for name, role in roles.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise VlrlError(f"roles file {path}: {name!r} is not an identity name (letters, digits, . _ @ -)")
        if role not in ROLES:
            raise VlrlError(f"roles file {path}: identity {name} has role {role!r}; roles are {', '.join(ROLES)}")
    return dict(roles)


class Identities:
    """Token -> Identity for every identity of an access directory (tokens compared by SHA-256)."""

    def __init__(self, by_digest: dict[bytes, Identity]):
        self._by_digest = by_digest

    @classmethod
    def single(cls, token: str, name: str = "admin") -> Identities:
        """One key, one identity with every right: `vlrl serve --api-key` as before roles existed."""
        return cls({_digest(token): Identity(name, "admin")})

    @classmethod
    def from_dir(cls, directory: str | Path, roles_file: str | Path | None = None) -> Identities:
        """Every NAME.token (or NAME.sha256) of `directory`, with its role from `roles_file`
        (default DIRECTORY/roles.yaml)."""
        directory = Path(directory)
        if not directory.is_dir():
            raise VlrlError(
                f"access directory {directory} does not exist; it holds NAME.token (or NAME.sha256) files and "
                f"{ROLES_FILE}"
            )
        roles = read_roles(roles_file or directory / ROLES_FILE)
        tokens: dict[str, Path] = {}
        for p in sorted(directory.iterdir()):
            suffix = next((s for s in (TOKEN_SUFFIX, DIGEST_SUFFIX) if p.name.endswith(s)), None)
            if suffix is None or p.name.startswith("."):
                continue
            name = p.name[: -len(suffix)]
            if name in tokens:
                raise VlrlError(f"identity {name} has both {tokens[name].name} and {p.name} in {directory}; keep one")
            tokens[name] = p
        if not tokens:
            raise VlrlError(f"access directory {directory} has no NAME{TOKEN_SUFFIX} or NAME{DIGEST_SUFFIX} files")
        by_digest: dict[bytes, Identity] = {}
        for name, path in tokens.items():
            if name not in roles:
                raise VlrlError(f"{path} has no role: add `{name}: viewer|trainer|approver|admin` to the roles file")
            digest = read_digest_file(path) if path.name.endswith(DIGEST_SUFFIX) else _digest(read_token_file(path))
            if digest in by_digest:
                raise VlrlError(
                    f"identities {by_digest[digest].name} and {name} have the same token; give each its own"
                )
            by_digest[digest] = Identity(name, roles[name])
        missing = sorted(set(roles) - set(tokens))
        if missing:
            raise VlrlError(
                f"the roles file names {', '.join(missing)} but {directory} has no {missing[0]}{TOKEN_SUFFIX} (or "
                f"{DIGEST_SUFFIX})"
            )
        return cls(by_digest)

    def add(self, token: str, identity: Identity) -> None:
        """One more identity (e.g. the server's own registry watcher)."""
        self._by_digest[_digest(token)] = identity

    def identify(self, token: str | bytes) -> Identity | None:
        """The identity holding `token`, or None (every digest compared: no early exit on a match)."""
        digest = _digest(token)
        found = None
        for known, identity in self._by_digest.items():
            if secrets.compare_digest(digest, known):
                found = identity
        return found

    def __len__(self) -> int:
        return len(self._by_digest)


def identity_from_file(directory: str | Path, token_file: str | Path) -> Identity:
    """The identity whose token is in `token_file`, looked up in the access directory."""
    token = read_token_file(token_file)
    identity = Identities.from_dir(directory).identify(token)
    if identity is None:
        raise VlrlError(f"the token in {token_file} belongs to no identity of {directory}")
    return identity
