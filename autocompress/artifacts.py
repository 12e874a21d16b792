"""Artifacts: files and directories that stages hand to each other, by reference.

A stage never passes a model or a tensor to the next one; it *publishes* what it
wrote (a model directory, a JSON file, a plot) into a ``Store`` and passes an
``ArtifactRef``: where it is (URI), what it is (sha256 of its content) and a few
headline numbers. Because the hash is of the content, a reference is a stable
cache key, and anyone can re-check that the bytes at the URI are still the ones
that were published (``Store.verify``, used by ``autocompress lineage``).

Two stores, one interface:

* ``LocalStore`` — a directory (default ``$AUTOCOMPRESS_HOME/artifacts``).
* ``S3Store`` — ``s3://bucket/prefix`` on AWS or any S3-compatible server
  (MinIO, moto, Ceph...) through boto3. The endpoint comes from the argument or
  from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` / ``MLFLOW_S3_ENDPOINT_URL``;
  credentials only from boto3's usual sources (environment, profile, instance
  role) and are never logged.

Publishing is all-or-nothing. Keys are content-addressed
(``<kind>/<sha256[:16]>/<name>``), the data is written first and a small
``<key>.manifest.json`` last; a reader trusts an artifact only when its manifest
exists and the hashes agree, so a crash mid-upload leaves nothing trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, Field

from autocompress.atomic import (
    fsync_tree,
    remove_path,
    remove_stale_temporaries,
    temp_sibling,
    write_json_atomic,
)
from autocompress.errors import AutoCompressError
from autocompress.paths import home

MANIFEST_SUFFIX = ".manifest.json"
_CHUNK = 1 << 20


class ArtifactRef(BaseModel):
    """A published file or directory: where it is, its content hash, headline numbers."""

    uri: str = Field(description="file:///... or s3://bucket/key")
    sha256: str = Field(description="sha256_path() of the content")
    kind: str = Field(description="what it is: model, costmodel, archspec, report, ...")
    size_bytes: int = 0
    metrics: dict[str, float] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict, description="small JSON-able facts")

    @property
    def name(self) -> str:
        """The last path component of the URI (file or directory name)."""
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    def local_path(self) -> Path | None:
        """The path on this machine for ``file://`` URIs, else None."""
        parsed = urlparse(self.uri)
        if parsed.scheme == "file":
            return Path(unquote(parsed.path))
        return None


# ---------------------------------------------------------------------------
# Hashing


def sha256_file(path: Path) -> str:
    """sha256 of one file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _dir_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under ``root`` as (posix relative path, path), sorted by name.

    Every file counts, ``*.manifest.json`` included: a store's manifests sit
    next to an artifact, never inside it, so a file of that name inside a
    directory is content like any other (leaving it out would let one be added
    unnoticed).
    """
    files = []
    for path in root.rglob("*"):
        if path.is_file():
            files.append((path.relative_to(root).as_posix(), path))
    return sorted(files)


def file_digests(path: Path) -> dict[str, str]:
    """``{relative path: sha256}`` for a directory, ``{name: sha256}`` for a file."""
    path = Path(path)
    if path.is_file():
        return {path.name: sha256_file(path)}
    return {rel: sha256_file(p) for rel, p in _dir_files(path)}


def combine_digests(digests: dict[str, str], is_dir: bool) -> str:
    """The artifact hash from per-file hashes (one file: its own hash)."""
    if not is_dir:
        (only,) = digests.values()
        return only
    # Hash of "relpath\0filehash\n" lines in sorted order: independent of file
    # system order, timestamps and permissions; a rename changes the hash.
    digest = hashlib.sha256(b"autocompress-dir-v1\n")
    for rel in sorted(digests):
        digest.update(f"{rel}\0{digests[rel]}\n".encode())
    return digest.hexdigest()


def sha256_path(path: str | Path) -> str:
    """Content hash of a file, or of a directory tree (names + contents, stable order)."""
    path = Path(path)
    if not path.exists():
        raise AutoCompressError(f"cannot hash {path}: it does not exist")
    return combine_digests(file_digests(path), path.is_dir())


def content_key(kind: str, sha256: str, name: str) -> str:
    """Where a published artifact lives inside a store: content-addressed."""
    return f"{kind}/{sha256[:16]}/{name}"


# ---------------------------------------------------------------------------
# Stores


class Store:
    """Where artifacts are published. Use ``Store.from_uri``."""

    uri: str

    @staticmethod
    def from_uri(uri: str | Path | None = None, endpoint_url: str | None = None) -> Store:
        """A store for ``s3://bucket/prefix``, ``file:///dir``, a plain dir, or the default.

        The default is ``$AUTOCOMPRESS_STORE`` if set, else ``$AUTOCOMPRESS_HOME/artifacts``.
        """
        uri = str(uri) if uri else os.environ.get("AUTOCOMPRESS_STORE") or ""
        if not uri:
            return LocalStore(home() / "artifacts")
        parsed = urlparse(uri)
        if parsed.scheme == "s3":
            return S3Store(parsed.netloc, parsed.path.strip("/"), endpoint_url=endpoint_url)
        if parsed.scheme == "file":
            return LocalStore(Path(unquote(parsed.path)))
        if parsed.scheme in ("", None) or len(parsed.scheme) == 1:  # 1 letter: a drive
            return LocalStore(Path(uri).expanduser())
        raise AutoCompressError(
            f"unsupported artifact store {uri!r}", "use a directory, file:///dir or s3://bucket/prefix"
        )

    @staticmethod
    def for_ref(ref: ArtifactRef, endpoint_url: str | None = None) -> Store:
        """A store able to read ``ref`` (its bucket for S3, the file system otherwise)."""
        parsed = urlparse(ref.uri)
        if parsed.scheme == "s3":
            return S3Store(parsed.netloc, "", endpoint_url=endpoint_url)
        return LocalStore(Path("/"))

    # -- interface -----------------------------------------------------------
    def publish(self, path: str | Path, kind: str, name: str | None = None,
                metrics: dict[str, float] | None = None, meta: dict[str, Any] | None = None,
                move: bool = False) -> ArtifactRef:
        """Copy (or move) ``path`` into the store atomically and return its reference."""
        raise NotImplementedError

    def fetch(self, ref: ArtifactRef, dest: str | Path | None = None) -> Path:
        """A local path holding ``ref``'s content, hash-checked (downloads if remote)."""
        raise NotImplementedError

    def verify(self, ref: ArtifactRef) -> str:
        """Re-hash the content at ``ref.uri``: ok / missing / incomplete / mismatch."""
        raise NotImplementedError


def _manifest(ref: ArtifactRef, digests: dict[str, str], is_dir: bool) -> dict[str, Any]:
    return {
        "format": "autocompress-artifact-v1",
        "sha256": ref.sha256,
        "kind": ref.kind,
        "is_dir": is_dir,
        "files": digests,
        "size_bytes": ref.size_bytes,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for _, p in _dir_files(path))


def _check_source(path: Path) -> None:
    if not path.exists():
        raise AutoCompressError(f"cannot publish {path}: it does not exist")


class LocalStore(Store):
    """Artifacts in a directory on this machine."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().resolve()
        self.uri = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def publish(self, path, kind, name=None, metrics=None, meta=None, move=False) -> ArtifactRef:
        src = Path(path)
        _check_source(src)
        digests = file_digests(src)
        sha = combine_digests(digests, src.is_dir())
        dest = self.root / content_key(kind, sha, name or src.name)
        ref = ArtifactRef(uri=dest.as_uri(), sha256=sha, kind=kind, size_bytes=_size(src),
                          metrics=metrics or {}, meta=meta or {})
        manifest_path = dest.with_name(dest.name + MANIFEST_SUFFIX)
        # Content-addressed: the same bytes may be published already. They are reused
        # only once re-hashed: a manifest vouches for what was written, not for what
        # is on disk now, and a corrupt entry is replaced by the good bytes.
        if (_read_json(manifest_path).get("sha256") == sha and dest.exists()
                and sha256_path(dest) == sha):
            if move:
                remove_path(src)
            return ref
        remove_stale_temporaries(dest)  # a copy a killed publish left next to the entry
        _put_in_place(src, dest, move)
        write_json_atomic(manifest_path, _manifest(ref, digests, src.is_dir()), indent=None)
        return ref

    def fetch(self, ref: ArtifactRef, dest=None) -> Path:
        path = ref.local_path()
        if path is None:
            raise AutoCompressError(f"{ref.uri} is not a local artifact",
                                    "fetch it through Store.for_ref(ref)")
        status = self.verify(ref)
        if status != "ok":
            raise AutoCompressError(f"artifact {ref.uri} is {status}",
                                    "re-run the stage that produced it")
        if dest is None:
            return path
        dest = Path(dest)
        _put_in_place(path, dest, move=False)
        return dest

    def verify(self, ref: ArtifactRef) -> str:
        path = ref.local_path()
        if path is None or not path.exists():
            return "missing"
        manifest = _read_json(path.with_name(path.name + MANIFEST_SUFFIX))
        if not manifest:
            return "incomplete"
        return "ok" if sha256_path(path) == ref.sha256 == manifest.get("sha256") else "mismatch"


class S3Store(Store):
    """Artifacts under ``s3://bucket/prefix`` (AWS or any S3-compatible endpoint)."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None):
        if not bucket:
            raise AutoCompressError("an S3 store needs a bucket", "use s3://BUCKET/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or s3_endpoint_url()
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client = None

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint_url={self.endpoint_url!r})"

    @property
    def client(self):
        if self._client is None:
            self._client = s3_client(self.endpoint_url)
        return self._client

    def _key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def publish(self, path, kind, name=None, metrics=None, meta=None, move=False) -> ArtifactRef:
        src = Path(path)
        _check_source(src)
        is_dir = src.is_dir()
        digests = file_digests(src)
        sha = combine_digests(digests, is_dir)
        key = self._key(content_key(kind, sha, name or src.name))
        ref = ArtifactRef(uri=f"s3://{self.bucket}/{key}", sha256=sha, kind=kind,
                          size_bytes=_size(src), metrics=metrics or {}, meta=meta or {})
        if self._read_manifest(key).get("sha256") != sha:
            files = _dir_files(src) if is_dir else [(None, src)]
            for rel, file_path in files:
                obj_key = f"{key}/{rel}" if rel else key
                self._call("upload", self.client.upload_file, str(file_path), self.bucket, obj_key)
            # The manifest goes last: until it exists, readers treat the key as absent.
            body = json.dumps(_manifest(ref, digests, is_dir)).encode()
            self._call("upload", self.client.put_object, Bucket=self.bucket,
                       Key=key + MANIFEST_SUFFIX, Body=body, ContentType="application/json")
        if move:
            remove_path(src)
        return ref

    def fetch(self, ref: ArtifactRef, dest=None) -> Path:
        bucket, key = _split_s3(ref.uri)
        manifest = self._read_manifest(key, bucket)
        if manifest.get("sha256") != ref.sha256:
            state = "missing or incompletely uploaded" if not manifest else "a different version"
            raise AutoCompressError(f"artifact {ref.uri} is {state}",
                                    "re-run the stage that produced it")
        if dest is None:
            dest = home() / "cache" / "artifacts" / _safe_part(ref.sha256[:16], ref) \
                / _safe_part(ref.name, ref)
        dest = Path(dest)
        if dest.exists() and sha256_path(dest) == ref.sha256:
            return dest
        # Names come from the bucket: check them all before writing anything.
        files = [_safe_relpath(rel, ref) for rel in manifest["files"]] \
            if manifest.get("is_dir") else []
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(dest)
        try:
            if manifest.get("is_dir"):
                for rel in files:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    self._call("download", self.client.download_file, bucket, f"{key}/{rel}",
                               str(tmp / rel))
            else:
                self._call("download", self.client.download_file, bucket, key, str(tmp))
            got = sha256_path(tmp)
            if got != ref.sha256:
                raise AutoCompressError(f"artifact {ref.uri} failed its hash check "
                                        f"({got[:12]} != {ref.sha256[:12]})",
                                        "the object changed after publishing; re-run the stage")
            fsync_tree(tmp)
            remove_path(dest)
            os.replace(tmp, dest)
        finally:
            remove_path(tmp)
        return dest

    def verify(self, ref: ArtifactRef) -> str:
        bucket, key = _split_s3(ref.uri)
        manifest = self._read_manifest(key, bucket)
        if not manifest:
            return "missing"
        if manifest.get("sha256") != ref.sha256:
            return "mismatch"
        with tempfile.TemporaryDirectory(prefix="autocompress-verify-") as tmp:
            try:
                self.fetch(ref, Path(tmp) / ref.name)
            except AutoCompressError as err:
                return "mismatch" if "hash check" in err.message else "incomplete"
        return "ok"

    def list_keys(self, prefix: str = "") -> list[str]:
        """All object keys under this store's prefix (+ ``prefix``), for tests and tools."""
        paginator = self.client.get_paginator("list_objects_v2")
        keys = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def _read_manifest(self, key: str, bucket: str | None = None) -> dict[str, Any]:
        from botocore.exceptions import ClientError  # lazy: boto3, only S3 stores need it

        try:
            obj = self.client.get_object(Bucket=bucket or self.bucket, Key=key + MANIFEST_SUFFIX)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return {}
            raise _s3_error(err, "read", bucket or self.bucket) from err
        except Exception as err:  # connection problems
            raise _s3_error(err, "read", bucket or self.bucket) from err
        return json.loads(obj["Body"].read())

    def _call(self, action: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            raise _s3_error(err, action, self.bucket) from err


# ---------------------------------------------------------------------------
# S3 helpers


def s3_endpoint_url() -> str | None:
    """The S3 endpoint from the environment (None = AWS itself)."""
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL"):
        if os.environ.get(var):
            return os.environ[var]
    return None


def s3_client(endpoint_url: str | None = None):
    """A boto3 S3 client; a missing credential is a user error with a hint."""
    import boto3  # lazy: boto3, only S3 stores need it

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise AutoCompressError(
            "no AWS credentials found for the S3 artifact store",
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an IAM role",
        )
    return session.client("s3", endpoint_url=endpoint_url or s3_endpoint_url())


def _s3_error(err: Exception, action: str, bucket: str) -> AutoCompressError:
    """Turn a boto3 failure into one line with a hint; never echo credentials."""
    from botocore.exceptions import BotoCoreError, ClientError  # lazy: boto3, S3 only

    if isinstance(err, AutoCompressError):
        return err
    code = ""
    if isinstance(err, ClientError):
        code = err.response.get("Error", {}).get("Code", "")
    inner = getattr(err, "last_exception", None)  # boto3's S3UploadFailedError wraps one
    if isinstance(inner, ClientError):
        code = inner.response.get("Error", {}).get("Code", "")
    hints = {
        "NoSuchBucket": f"create the bucket {bucket!r} or fix the store URI",
        "AccessDenied": "the credentials in use may not access this bucket",
        "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID / the profile in use",
        "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY / the profile in use",
    }
    if code:
        return AutoCompressError(f"S3 {action} failed on bucket {bucket!r}: {code}",
                                 hints.get(code, "check the bucket, endpoint and credentials"))
    if isinstance(err, BotoCoreError) or "Could not connect" in str(err):
        return AutoCompressError(
            f"S3 {action} failed on bucket {bucket!r}: {type(err).__name__}",
            "check the endpoint (AWS_ENDPOINT_URL / MLFLOW_S3_ENDPOINT_URL) and the network",
        )
    return AutoCompressError(f"S3 {action} failed on bucket {bucket!r}: {err}")


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


# ---------------------------------------------------------------------------
# Small file-system helpers


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _put_in_place(src: Path, dest: Path, move: bool) -> None:
    """Copy (or move) ``src`` to ``dest`` through a temp sibling; replaces ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(dest)
    try:
        if move:
            shutil.move(str(src), tmp)
        elif src.is_dir():
            shutil.copytree(src, tmp)
        else:
            shutil.copy2(src, tmp)
        fsync_tree(tmp)
        remove_path(dest)  # left by a crash between rename and manifest: untrusted
        os.replace(tmp, dest)
    finally:
        remove_path(tmp)


def _safe_relpath(rel: str, ref: ArtifactRef) -> str:
    """A manifest's file name, refused unless it stays inside the artifact's folder."""
    parts = rel.split("/") if isinstance(rel, str) else [""]
    escapes = (parts[0] == "" or ":" in parts[0] or "\\" in rel
               or any(p in ("", ".", "..") for p in parts))  # "" also catches "/x" and "a//b"
    if escapes:
        raise AutoCompressError(
            f"artifact {ref.uri} lists a file outside its folder ({rel!r}); nothing was written",
            "the manifest in the store was tampered with; re-run the stage that produced it",
        )
    return rel


def _safe_part(name: str, ref: ArtifactRef) -> str:
    """One path component taken from a reference (no separators, no ``..``)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise AutoCompressError(f"artifact reference {ref.uri} has an unusable name {name!r}",
                                "re-run the stage that produced it")
    return name


def fetch(ref: ArtifactRef, dest: str | Path | None = None) -> Path:
    """A hash-checked local copy (or the local path) of any reference."""
    return Store.for_ref(ref).fetch(ref, dest)


def verify(ref: ArtifactRef) -> str:
    """``ok`` / ``missing`` / ``incomplete`` / ``mismatch`` / ``unreachable`` for any reference."""
    return verify_with_cause(ref)[0]


def verify_with_cause(ref: ArtifactRef) -> tuple[str, str | None]:
    """``verify``'s status and, when the store could not be reached, why (one line)."""
    try:
        return Store.for_ref(ref).verify(ref), None
    except AutoCompressError as err:
        return "unreachable", str(err)
