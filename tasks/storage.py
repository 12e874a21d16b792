"""Where Prefect persists task results (the cache): local by default, S3 when configured.

Results are small JSON documents (``ArtifactRef``s), stored next to the
artifacts they point to, so wiping one wipes the other.

Resolution, first match wins:

1. ``AUTOCOMPRESS_RESULTS``: a saved block slug (``s3-bucket/autocompress-results``),
   ``s3://bucket/prefix``, or a local directory.
2. ``AUTOCOMPRESS_STORE=s3://bucket/prefix`` (the artifact store): results under
   ``<prefix>/prefect-results`` in the same bucket.
3. ``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK`` (Prefect's own setting): left to Prefect.
4. ``$AUTOCOMPRESS_HOME/prefect-results`` on this machine.

An S3 URI becomes a ``prefect_aws.S3Bucket`` block saved on the Prefect server
under a name derived from the URI and endpoint (Prefect requires result storage
blocks to be saved). Its credentials are left empty, so boto3's usual chain
(environment, profile, role) applies on each worker — nothing secret is stored.
Workers that resolve the same environment see the same cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from urllib.parse import urlparse

from autocompress.artifacts import s3_endpoint_url


def result_storage():
    """The result storage to use now (None = leave it to Prefect's settings)."""
    explicit = os.environ.get("AUTOCOMPRESS_RESULTS", "")
    store = os.environ.get("AUTOCOMPRESS_STORE", "")
    if explicit:
        if explicit.startswith("s3://"):
            return saved_s3_block(explicit, s3_endpoint_url())
        if "/" in explicit and not explicit.startswith(("/", ".", "~")) \
                and not Path(explicit).exists():
            return explicit  # a block slug: Prefect loads the saved block
        return Path(explicit).expanduser().resolve()
    if store.startswith("s3://"):
        return saved_s3_block(store.rstrip("/") + "/prefect-results", s3_endpoint_url())
    if os.environ.get("PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK"):
        return None
    from autocompress.paths import home

    return home() / "prefect-results"


def saved_s3_block(uri: str, endpoint_url: str | None) -> str:
    """The slug of the S3Bucket block for ``uri``, saved on the API server once per process."""
    from prefect.settings import PREFECT_API_URL

    return _save_once(uri, endpoint_url, PREFECT_API_URL.value())


@functools.cache
def _save_once(uri: str, endpoint_url: str | None, api_url: str | None) -> str:
    name = "autocompress-results-" + hashlib.sha256(
        f"{uri}|{endpoint_url}".encode()).hexdigest()[:12]
    return save_s3_result_block(name, uri, endpoint_url)


def _s3_bucket(uri: str, endpoint_url: str | None):
    from prefect_aws import AwsClientParameters, AwsCredentials, S3Bucket

    parsed = urlparse(uri)
    credentials = AwsCredentials(
        aws_client_parameters=AwsClientParameters(endpoint_url=endpoint_url))
    return S3Bucket(bucket_name=parsed.netloc, bucket_folder=parsed.path.strip("/"),
                    credentials=credentials)


def save_s3_result_block(name: str, uri: str, endpoint_url: str | None = None) -> str:
    """Save an ``S3Bucket`` block for ``s3://bucket/prefix`` on the Prefect server.

    Use it when workers should find result storage by name
    (``PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK=s3-bucket/<name>`` or
    ``AUTOCOMPRESS_RESULTS=s3-bucket/<name>``). No credentials are saved: workers
    use their own AWS environment. Returns the block slug.
    """
    block = _s3_bucket(uri, endpoint_url or s3_endpoint_url())
    block.save(name, overwrite=True)
    return f"s3-bucket/{name}"
