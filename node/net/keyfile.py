"""Identity key files on disk: created atomically with mode 0600, never overwritten, checked on load.

The byte format and its parsing are `protocol/identity.py`; this module only touches the disk.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from protocol.errors import KeyFileError
from protocol.identity import MAX_KEY_FILE_BYTES, Identity, decode_key_file, encode_key_file
from validator.atomicfile import fsync_dir

DEFAULT_KEY_PATH = Path.home() / ".pulse" / "identity.key"


def write_key_file(identity: Identity, path: Path) -> None:
    """Write `identity` to `path` (mode 0600). Refuses to replace an existing file.

    The file appears whole or not at all: temp file in the same folder, fsync, then a hard link
    to the final name (which, unlike rename, fails if the name exists), then fsync the folder.
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise KeyFileError(f"{path} already exists; refusing to overwrite an identity key")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode_key_file(identity))
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError as exc:
        raise KeyFileError(f"{path} already exists; refusing to overwrite an identity key") from exc
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def load_key_file(path: Path) -> Identity:
    """Read an identity. Loose permissions, a wrong length or a corrupt file: `KeyFileError`."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        raise KeyFileError(f"{path}: no such key file (create one with `pulse keygen --out {path}`)") from exc
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot open key file ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        _check_permissions(path, info)
        data = f.read(MAX_KEY_FILE_BYTES + 1)
    return decode_key_file(data, source=str(path))


def _check_permissions(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise KeyFileError(f"{path}: not a regular file")
    if info.st_uid != os.getuid():
        raise KeyFileError(f"{path}: owned by uid {info.st_uid}, not by this user")
    loose = stat.S_IMODE(info.st_mode) & 0o077
    if loose:
        mode = stat.S_IMODE(info.st_mode)
        raise KeyFileError(f"{path}: permissions {mode:04o} let others read the key; run `chmod 600 {path}`")
