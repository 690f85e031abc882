"""``file://`` storage: temp file, fsync, rename; link for no-overwrite puts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gym_services.control.storage.base import AlreadyExists, NotFound, Storage, StorageError, check_key


class FileStorage(Storage):
    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.url = f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _write_temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def _sync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        os.replace(tmp, path)
        self._sync_dir(path.parent)

    def put_if_absent(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)  # atomic, and fails if the target exists
        except FileExistsError:
            raise AlreadyExists(f"{self.url}/{key} already exists") from None
        finally:
            os.unlink(tmp)
        self._sync_dir(path.parent)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"{self.url}/{key} does not exist") from None
        except IsADirectoryError:
            raise NotFound(f"{self.url}/{key} is a folder, not an object") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        path = self._path(key)
        try:
            return path.stat().st_size if path.is_file() else None
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.strip("/") if prefix else self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith("."):
                    continue  # in-progress temp files
                keys.append(str(Path(dirpath, name).relative_to(self.root)))
        return sorted(keys)

    def probe(self) -> None:
        """The folder is there (or can be made: its nearest existing parent is a folder this process may write)."""
        path = self.root
        while not path.exists() and path != path.parent:
            path = path.parent
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise StorageError(f"{self.url}: {path} is not a folder this process can write")

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise StorageError(f"{self.url}/{key} is a folder") from None
