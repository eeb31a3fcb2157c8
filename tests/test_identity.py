"""Ed25519 identities and key files: format, permissions, no overwrite, clear errors."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from node.commands import keygen as keygen_command
from node.net.keyfile import load_key_file, write_key_file
from protocol.errors import InvalidSignature, KeyFileError
from protocol.identity import Identity, decode_key_file, encode_key_file, verify_signature


def test_sign_and_verify_roundtrip() -> None:
    identity = Identity.generate()
    signature = identity.sign(b"hello")
    verify_signature(identity.public_key, b"hello", signature)
    with pytest.raises(InvalidSignature):
        verify_signature(identity.public_key, b"hellO", signature)
    with pytest.raises(InvalidSignature):
        verify_signature(Identity.generate().public_key, b"hello", signature)
    with pytest.raises(InvalidSignature):
        verify_signature(identity.public_key, b"hello", signature[:-1])


def test_key_file_bytes_roundtrip() -> None:
    identity = Identity.generate()
    assert decode_key_file(encode_key_file(identity)).public_key == identity.public_key


def test_write_creates_0600_and_loads(tmp_path: Path) -> None:
    identity = Identity.generate()
    path = tmp_path / "sub" / "id.key"
    write_key_file(identity, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key_file(path).public_key == identity.public_key
    assert [p.name for p in path.parent.iterdir()] == ["id.key"]  # no temp file left behind


def test_write_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "id.key"
    first = Identity.generate()
    write_key_file(first, path)
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        write_key_file(Identity.generate(), path)
    assert load_key_file(path).public_key == first.public_key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_load_rejects_loose_permissions(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "id.key"
    write_key_file(Identity.generate(), path)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_key_file(path)


def _write_raw(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _corrupt(kind: str, good: bytes) -> bytes:
    header, seed_line, public_line = good.decode().splitlines()
    seed = seed_line.split()[1]
    flipped = ("1" if seed[0] == "0" else "0") + seed[1:]
    return {
        "empty": b"",
        "binary": b"\xff\xfe" * 20,
        "header": good.replace(b"pulse-ed25519-v1", b"pulse-rsa-v1"),
        "short_seed": f"{header}\nseed {seed[:-2]}\n{public_line}\n".encode(),
        "long_seed": f"{header}\nseed {seed}00\n{public_line}\n".encode(),
        "not_hex": f"{header}\nseed {'zz' * 32}\n{public_line}\n".encode(),
        "flipped_seed": f"{header}\nseed {flipped}\n{public_line}\n".encode(),
        "huge": good * 100,
    }[kind]


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("empty", "not a pulse key file"),
        ("binary", "not ASCII"),
        ("header", "not a pulse key file"),
        ("short_seed", "wrong length"),
        ("long_seed", "wrong length"),
        ("not_hex", "not hex"),
        ("flipped_seed", "does not match"),
        ("huge", "too large"),
    ],
)
def test_load_rejects_bad_files(tmp_path: Path, kind: str, message: str) -> None:
    good = encode_key_file(Identity.generate())
    path = _write_raw(tmp_path / "id.key", _corrupt(kind, good))
    with pytest.raises(KeyFileError, match=message) as info:
        load_key_file(path)
    assert str(path) in str(info.value)


def test_load_missing_file_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="pulse keygen"):
        load_key_file(tmp_path / "nope.key")


def _keygen(*argv: str) -> int:
    # Only this command's parser: the test does not depend on every other command importing.
    parser = argparse.ArgumentParser()
    keygen_command.register(parser.add_subparsers())
    args = parser.parse_args(["keygen", *argv])
    return int(args.func(args))


def test_keygen_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "node.key"
    assert _keygen("--out", str(path)) == 0
    printed = capsys.readouterr().out
    assert load_key_file(path).public_hex in printed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _keygen("--out", str(path)) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
