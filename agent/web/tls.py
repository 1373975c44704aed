"""The agent server's TLS context: PEM certificate and key read bounded, refused with the
file named and why (not PEM, an encrypted key, a key that is not the certificate's).
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from nodecheck.checks.lazy_logging import get_logger
from nodecheck.checks.node.fs import NotRegularFileError, read_regular_file

log = get_logger(__name__)

PEM_FILE_LIMIT = 1 << 20  # a certificate chain or a key is a few kB
PEM_CERTIFICATE_BLOCK = re.compile(
    r"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL
)


class _PassPhraseWantedError(Exception):
    pass


def _refuse_pass_phrase() -> str:
    """OpenSSL would prompt on the terminal for an encrypted key without a password
    callback (ssl.SSLContext.load_cert_chain); the agent has no terminal to ask on."""
    raise _PassPhraseWantedError


def _read_pem(path: Path, what: str) -> str:
    """The file's text; ValueError naming it when it is no regular, readable, small file.
    Opened only once stat says it is a regular file (never a device: opening one has
    side effects), non-blocking. Bytes outside ASCII (a UTF-8 "Bag Attributes:
    friendlyName" line of openssl pkcs12's output) become U+FFFD."""
    try:
        data = read_regular_file(path, PEM_FILE_LIMIT)
    except NotRegularFileError as err:
        raise ValueError(f"{path}: the {what} is {err.kind}") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read the {what}: {err.strerror}") from err
    except ValueError:  # a NUL in the path
        raise ValueError(f"{path!r}: cannot read the {what}: a NUL in the path") from None
    if len(data) > PEM_FILE_LIMIT:
        raise ValueError(f"{path}: the {what} is over {PEM_FILE_LIMIT} bytes")
    return data.decode("ascii", "replace")


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The server's context, TLS 1.2 or later; ValueError naming the file and why when the
    certificate or key cannot be used (missing, unreadable, not PEM, an encrypted key,
    a key that is not the certificate's)."""
    cert_text = _read_pem(cert, "certificate")
    key_text = _read_pem(key, "private key")
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise ValueError(f"{cert}: not a PEM certificate (no BEGIN CERTIFICATE line)")
    key_header = re.search(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----", key_text)
    if key_header is None:
        raise ValueError(f"{key}: not a PEM private key (no BEGIN PRIVATE KEY line)")
    # PKCS#8 "BEGIN ENCRYPTED PRIVATE KEY", or the legacy "Proc-Type: 4,ENCRYPTED" header
    encrypted_hint = (
        f"{key}: the private key is encrypted and the agent cannot ask for its pass phrase: "
        "store it unencrypted (openssl pkey -in KEY -out KEY.plain), readable only by the agent"
    )
    if "ENCRYPTED" in key_header.group(1) or "Proc-Type: 4,ENCRYPTED" in key_text:
        raise ValueError(encrypted_hint)
    # Only the certificate blocks: cadata takes an ASCII string only.
    _certificate_blocks(cert_text, cert, "certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key, password=_refuse_pass_phrase)
    except _PassPhraseWantedError as err:
        raise ValueError(encrypted_hint) from err
    except ssl.SSLError as err:
        if err.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(
                f"{key}: the private key does not match the certificate {cert}"
            ) from err
        raise ValueError(
            f"{key}: not a usable private key for {cert}: {err.reason or err}"
        ) from err
    except OSError as err:  # replaced between the reads above and OpenSSL's
        raise ValueError(f"{cert}, {key}: cannot read: {err.strerror}") from err
    return context


def pem_certificates(path: Path, what: str) -> str:
    """The certificate blocks of a PEM file joined, as SSLContext.load_verify_locations
    takes them (cadata); ValueError naming the file when it is no regular, readable, small
    file, holds no certificate, or one OpenSSL cannot read. For a file of CA certificates
    (a client CA)."""
    return _certificate_blocks(_read_pem(path, what), path, what)


def _certificate_blocks(text: str, path: Path, what: str) -> str:
    """The BEGIN/END CERTIFICATE blocks of `text`, joined, each checked by OpenSSL; text
    outside them is explanatory and may be anything (RFC 7468 §2)."""
    blocks = PEM_CERTIFICATE_BLOCK.findall(text)
    if not blocks:
        raise ValueError(f"{path}: no PEM certificate in the {what} (no BEGIN/END CERTIFICATE)")
    for number, block in enumerate(blocks, start=1):
        if not block.isascii():
            raise ValueError(
                f"{path}: certificate {number} of the file has bytes outside ASCII inside "
                "its BEGIN/END CERTIFICATE lines: not base64"
            )
    joined = "\n".join(blocks)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=joined)
    except ssl.SSLError as err:
        raise ValueError(f"{path}: not a usable PEM {what}: {err.reason or err}") from err
    except (TypeError, UnicodeError) as err:
        raise ValueError(f"{path}: not a usable PEM {what}: {err}") from err
    return joined
