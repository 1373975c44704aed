"""The web configuration file of Prometheus exporters (`--web.config.file`), as the agent
serves it: TLS, client certificates, custom response headers and basic auth users.

The format is prometheus/exporter-toolkit's (docs/web-configuration.md; the Go code is
web/tls_config.go and web/handler.go), as node_exporter 1.5.0 reads it (Debian
bookworm's prometheus-node-exporter, built with exporter-toolkit 0.8.2), so one file
serves both. The same file means the same thing to both, or the agent refuses it in one
line naming the file, the line and the key:

- what node_exporter 1.5.0 refuses: an unknown key (its YAML is read strictly:
  yaml.v2's UnmarshalStrict, which also refuses a key given twice), an unknown
  client_auth_type, TLS version, cipher suite or curve, a header it does not let one set
  (web/handler.go, extraHTTPHeaders), a password that is no bcrypt hash, client_ca_file
  without a client_auth_type that asks for certificates, cert_file without key_file,
  cipher_suites without the suite HTTP/2 requires while http2 is on;
- what Python's ssl cannot do as Go's crypto/tls does: ask for a client certificate
  without verifying it (RequestClientCert, RequireAnyClientCert: ssl.CERT_OPTIONAL and
  CERT_REQUIRED both verify), TLS 1.0 or 1.1 (OpenSSL 3 refuses them at its default
  security level), more than one curve (SSLContext.set_ecdh_curve sets one);
- what would leave a server nobody can use, or one that trusts too much: a minimum
  version above the maximum, only TLS 1.3 cipher suites while TLS 1.2 is allowed,
  client certificates verified against the system's public CAs (no client_ca_file).

Relative paths are relative to the file's folder, as exporter-toolkit's
TLSConfig.SetDirectory makes them. Go re-reads the file on every request; the agent reads
it at start and on SIGHUP (a bad file then keeps the one in force).
"""

from __future__ import annotations

import ssl
from dataclasses import field
from pathlib import Path
from typing import Any

import yaml

from nodecheck.agent.config import UnreadableFileError, read_text_file
from nodecheck.agent.web.auth import bcrypt_hash_problem
from nodecheck.agent.web.tls import pem_certificates, tls_context
from nodecheck.checks.printable import printable
from nodecheck.checks.record import record

WEB_CONFIG_LIMIT = 1 << 20  # a web configuration is a few hundred bytes

# client_auth_type: Go's tls.ClientAuthType names (web/tls_config.go, ConfigToTLSConfig;
# "RequireClientCert" is its older name of RequireAnyClientCert). Python's ssl verifies
# every certificate it asks for (ssl docs, SSLContext.verify_mode: CERT_OPTIONAL "if the
# client chooses to send a certificate, it is verified"), so only these three map.
VERIFY_MODES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

# web/tls_config.go, tlsVersions; exporter-toolkit's defaults are TLS12 and TLS13.
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
REFUSED_VERSIONS = ("TLS10", "TLS11")

# Go's tls.CipherSuites() (crypto/tls/cipher_suites.go; the only names exporter-toolkit
# accepts, Cipher.UnmarshalYAML) with OpenSSL's name of each (openssl-ciphers(1), "TLS
# v1.2 cipher suites", or `openssl ciphers -stdname`). None: a TLS 1.3 suite, which
# neither Go (crypto/tls Config.CipherSuites: "TLS 1.3 ciphersuites are not
# configurable") nor Python's set_ciphers lets one choose: accepted, and without effect.
CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}

# Go's HTTP/2 server (golang.org/x/net/http2, ConfigureServer; net/http bundles it) refuses
# a cipher_suites list for TLS 1.2 without one of these (RFC 7540 §9.2.2); node_exporter
# then does not start.
HTTP2_REQUIRED_SUITES = (
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
)

# web/tls_config.go, curves, with OpenSSL's names of the groups (RFC 8422 §5.1.1's
# secp256r1 is OpenSSL's prime256v1).
CURVES = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
}

# web/handler.go, extraHTTPHeaders: the only headers one may set, with the values allowed
# where the header's values are an enumeration (None: any value). Names as written
# there: exporter-toolkit compares them exactly.
HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
TLS_KEYS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "cipher_suites",
    "curve_preferences",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
)
HTTP_KEYS = ("http2", "headers")
# Keys of later exporter-toolkit releases that node_exporter 1.5.0 refuses as unknown.
LATER_KEYS = {
    "client_allowed_sans": "exporter-toolkit 0.9",
    "rate_limit": "exporter-toolkit 0.11",
}


class WebConfigError(ValueError):
    """A web configuration that cannot be used: file:line: key: why, one line."""

    def __init__(self, path: Path, line: int | None, key: str, reason: str) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")


@record
class WebTls:
    cert_file: Path
    key_file: Path
    client_auth_type: str  # one of VERIFY_MODES
    client_ca_file: Path | None
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    ciphers: str | None  # OpenSSL's cipher list; None: OpenSSL's (Python's) default
    curve: str | None  # OpenSSL's group name; None: OpenSSL's default groups
    prefer_server_cipher_suites: bool


@record
class WebConfig:
    source: Path
    tls: WebTls | None  # None: plain HTTP (exporter-toolkit's errNoTLSConfig)
    http2: bool
    headers: tuple[tuple[str, str], ...]
    users: tuple[tuple[str, bytes], ...]  # empty: no basic auth
    # Built once when read (so a bad file is refused then): the server's context.
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)
    # What the agent does differently without changing who gets in: logged at start.
    notes: tuple[str, ...] = ()

    def users_dict(self) -> dict[str, bytes]:
        return dict(self.users)


class _Mapping(dict[str, Any]):
    """A YAML mapping with each key's line and, for scalar values, their text."""

    lines: dict[str, int]
    raw: dict[str, str]


class _DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: str, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


class _NonScalarKeyError(yaml.YAMLError):
    def __init__(self, line: int) -> None:
        super().__init__("a key that is not a scalar")
        self.line = line


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, reading every key as its text (exporter-toolkit reads the
    file into Go structs and map[string]string: yaml.v2 takes a scalar's text for a
    string), refusing a key given twice (yaml.v2's UnmarshalStrict does), and keeping
    each key's line for the error messages."""


class _MergeKeyError(yaml.YAMLError):
    def __init__(self, line: int) -> None:
        super().__init__("a merge key")
        self.line = line


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Mapping:
    for key_node, _ in node.value:
        # YAML merge keys (<<) are refused: PyYAML releases before 6.0.1 copy every merged
        # pair (nested merges grow exponentially from a few hundred bytes), and an
        # explicit key beside a merged one means different things to yaml.v2 and here.
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise _MergeKeyError(key_node.start_mark.line + 1)
    mapping = _Mapping()
    mapping.lines, mapping.raw = {}, {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise _NonScalarKeyError(line)
        key = str(key_node.value)
        if key in mapping:
            raise _DuplicateKeyError(key, line)
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = line
        if isinstance(value_node, yaml.ScalarNode):
            mapping.raw[key] = str(value_node.value)
    return mapping


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


class _Section:
    """Values taken out of one mapping of the file, each checked, errors naming the key."""

    def __init__(self, path: Path, prefix: str, mapping: _Mapping, line: int | None) -> None:
        self.path, self.prefix, self.mapping, self.line = path, prefix, mapping, line

    def fail(self, key: str | None, reason: str) -> WebConfigError:
        line = self.mapping.lines.get(key, self.line) if key else self.line
        dotted = ".".join(part for part in (self.prefix, key) if part)
        return WebConfigError(self.path, line, printable(dotted), reason)

    def refuse_unknown(self, known: tuple[str, ...]) -> None:
        for key in self.mapping:
            if key in known:
                continue
            if key in LATER_KEYS:
                raise self.fail(
                    key,
                    f"not in the format node_exporter 1.5.0 reads (added in "
                    f"{LATER_KEYS[key]}); it refuses the file too",
                )
            raise self.fail(
                key, f"unknown key (known: {', '.join(known)}); node_exporter refuses it too"
            )

    def text(self, key: str) -> str:
        """A string: a scalar's text as yaml.v2 reads one into a Go string (`5` is "5"),
        "" when absent or null."""
        value = self.mapping.get(key)
        if value is None:
            return ""
        if isinstance(value, (list, dict)):
            raise self.fail(key, f"expected a string, got {_kind(value)}")
        text = value if isinstance(value, str) else self.mapping.raw.get(key, str(value))
        if "\x00" in text:
            raise self.fail(key, "contains a NUL character")
        return text

    def flag(self, key: str, default: bool) -> bool:
        value = self.mapping.get(key, default)
        if value is None:
            return False  # yaml.v2: null sets a Go bool to its zero value
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_kind(value)}")
        return value

    def texts(self, key: str) -> list[str]:
        value = self.mapping.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of names, got {_kind(value)}")
        for item in value:
            if item is None or isinstance(item, (list, dict)):
                raise self.fail(key, f"expected a list of names, got {_kind(item)} in it")
        return [str(item) for item in value]

    def section(self, key: str) -> _Section:
        value = self.mapping.get(key)
        line = self.mapping.lines.get(key, self.line)
        dotted = ".".join(part for part in (self.prefix, key) if part)
        if value is None:
            empty = _Mapping()
            empty.lines, empty.raw = {}, {}
            return _Section(self.path, dotted, empty, line)
        if not isinstance(value, _Mapping):
            raise self.fail(key, f"expected a mapping, got {_kind(value)}")
        return _Section(self.path, dotted, value, line)

    def path_of(self, key: str) -> Path | None:
        """A file named by `key`: relative to the configuration's folder (exporter-toolkit,
        TLSConfig.SetDirectory with prometheus/common's config.JoinDir)."""
        text = self.text(key)
        if not text:
            return None
        return self.path.parent / text  # an absolute text stays itself


def _document(text: str, path: Path) -> _Mapping:
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader: safe_load with checks
    except _DuplicateKeyError as err:
        raise WebConfigError(path, err.line, err.key, "given twice") from None
    except _NonScalarKeyError as err:
        raise WebConfigError(path, err.line, "", "a key that is not a name") from None
    except _MergeKeyError as err:
        raise WebConfigError(
            path, err.line, "<<", "YAML merge keys are not read: write the keys out"
        ) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        reason = " ".join(str(part) for part in (err.context, err.problem) if part)
        raise WebConfigError(
            path, mark.line + 1 if mark else None, "", f"not YAML: {reason or err}"
        ) from None
    except yaml.YAMLError as err:
        raise WebConfigError(path, None, "", f"not YAML: {err}") from None
    except RecursionError:
        raise WebConfigError(path, None, "", "not YAML: nested too deeply") from None
    if document is None:  # an empty file: plain HTTP, no users, as for exporter-toolkit
        empty = _Mapping()
        empty.lines, empty.raw = {}, {}
        return empty
    if not isinstance(document, _Mapping):
        raise WebConfigError(
            path, 1, "", f"expected a mapping of {', '.join(TOP_KEYS)}, got {_kind(document)}"
        )
    return document


def _version(tls: _Section, key: str, default: str) -> tuple[str, ssl.TLSVersion]:
    name = tls.text(key) or default
    if name not in TLS_VERSIONS:
        raise tls.fail(key, f"unknown TLS version {name!r} (one of {', '.join(TLS_VERSIONS)})")
    if name in REFUSED_VERSIONS:
        raise tls.fail(
            key,
            f"{name}: OpenSSL 3 does not negotiate TLS 1.0 or 1.1 at its default security "
            "level (SHA-1 signatures); use TLS12 or TLS13",
        )
    return name, TLS_VERSIONS[name]


def _ciphers(tls: _Section, minimum: str) -> str | None:
    names = tls.texts("cipher_suites")
    chosen: list[str] = []
    for name in names:
        if name not in CIPHER_SUITES:
            raise tls.fail(
                "cipher_suites",
                f"unknown cipher {name!r}: only Go's tls.CipherSuites() names (an "
                "insecure suite is refused by node_exporter too)",
            )
        openssl_name = CIPHER_SUITES[name]
        if openssl_name is not None and openssl_name not in chosen:
            chosen.append(openssl_name)
    if names and not chosen and minimum != "TLS13":
        raise tls.fail(
            "cipher_suites",
            "only TLS 1.3 suites, which are not configurable (in Go either): a TLS 1.2 "
            "client would find no suite; add a TLS 1.2 suite or set min_version: TLS13",
        )
    return ":".join(chosen) or None


def _curve(tls: _Section) -> str | None:
    names = tls.texts("curve_preferences")
    for name in names:
        if name not in CURVES:
            raise tls.fail(
                "curve_preferences", f"unknown curve {name!r} (one of {', '.join(CURVES)})"
            )
    if len(names) > 1:
        raise tls.fail(
            "curve_preferences",
            "Python's ssl sets one curve (SSLContext.set_ecdh_curve), not a list in order "
            "of preference: name one",
        )
    return CURVES[names[0]] if names else None


def _tls(tls: _Section) -> WebTls | None:
    tls.refuse_unknown(TLS_KEYS)
    cert, key = tls.path_of("cert_file"), tls.path_of("key_file")
    client_auth = tls.text("client_auth_type")
    client_ca = tls.path_of("client_ca_file")
    # Validated whether TLS is on or not, as yaml.v2 reads them into their Go types.
    minimum_name, minimum = _version(tls, "min_version", "TLS12")
    maximum_name, maximum = _version(tls, "max_version", "TLS13")
    ciphers = _ciphers(tls, minimum_name)
    curve = _curve(tls)
    prefer_server = tls.flag("prefer_server_cipher_suites", True)
    if cert is None and key is None and not client_auth and client_ca is None:
        return None  # exporter-toolkit's errNoTLSConfig: plain HTTP
    if cert is None:
        raise tls.fail("cert_file", "missing: TLS needs cert_file and key_file")
    if key is None:
        raise tls.fail("key_file", "missing: TLS needs cert_file and key_file")
    auth = client_auth or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise tls.fail(
            "client_auth_type",
            f"{auth}: Python's ssl cannot ask for a client certificate without verifying "
            "it; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with "
            "client_ca_file",
        )
    if auth not in VERIFY_MODES:
        raise tls.fail(
            "client_auth_type",
            f"unknown {auth!r} (one of NoClientCert, VerifyClientCertIfGiven, "
            "RequireAndVerifyClientCert)",
        )
    if client_ca is not None and auth == "NoClientCert":
        raise tls.fail(
            "client_ca_file",
            "a client CA without a client_auth_type that asks for certificates "
            "(node_exporter refuses it too): set client_auth_type: RequireAndVerifyClientCert",
        )
    if client_ca is None and auth != "NoClientCert":
        raise tls.fail(
            "client_auth_type",
            f"{auth} without client_ca_file: Go would verify client certificates against "
            "the system's public CAs; name the CA that signs the scrapers' certificates",
        )
    if minimum > maximum:
        raise tls.fail(
            "min_version", f"{minimum_name} is above max_version {maximum_name}: no version left"
        )
    return WebTls(
        cert_file=cert,
        key_file=key,
        client_auth_type=auth,
        client_ca_file=client_ca,
        min_version=minimum,
        max_version=maximum,
        ciphers=ciphers,
        curve=curve,
        prefer_server_cipher_suites=prefer_server,
    )


def _headers(http: _Section) -> tuple[tuple[str, str], ...]:
    headers = http.section("headers")
    found: list[tuple[str, str]] = []
    for name in headers.mapping:
        if name not in HEADERS:
            raise headers.fail(
                name,
                f"this header cannot be set (node_exporter refuses it too; only "
                f"{', '.join(HEADERS)})",
            )
        value = headers.text(name)
        allowed = HEADERS[name]
        if allowed is not None and value not in allowed:
            raise headers.fail(
                name, f"expected one of {', '.join(allowed)}, got {value!r} (as node_exporter)"
            )
        if any((ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F for char in value):
            raise headers.fail(name, "a control character in the value")
        if not value.isascii():
            # http.server writes headers as Latin-1 (BaseHTTPRequestHandler.send_header),
            # Go's net/http the bytes as given: only ASCII means the same to both.
            raise headers.fail(name, "only ASCII in a header value")
        found.append((name, value))
    return tuple(found)


def _users(top: _Section) -> tuple[tuple[str, bytes], ...]:
    users = top.section("basic_auth_users")
    found: list[tuple[str, bytes]] = []
    for user in users.mapping:
        hashed = users.text(user)
        problem = bcrypt_hash_problem(hashed)
        if problem:
            raise users.fail(user, problem)
        found.append((user, hashed.encode()))
    return tuple(found)


def web_tls_context(tls: WebTls) -> ssl.SSLContext:
    """The server's context for `tls`; ValueError naming the file when the certificate,
    key or client CA cannot be used."""
    context = tls_context(tls.cert_file, tls.key_file)
    context.minimum_version = tls.min_version
    context.maximum_version = tls.max_version
    if tls.ciphers is not None:
        context.set_ciphers(tls.ciphers)  # TLS 1.2 and below: TLS 1.3's are apart
    if tls.curve is not None:
        context.set_ecdh_curve(tls.curve)
    if not tls.prefer_server_cipher_suites:
        # Python's server contexts prefer the server's order by default (ssl docs,
        # SSLContext: OP_CIPHER_SERVER_PREFERENCE is set by default).
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    context.verify_mode = VERIFY_MODES[tls.client_auth_type]
    if tls.client_ca_file is not None:
        context.load_verify_locations(cadata=pem_certificates(tls.client_ca_file, "client CA"))
    return context


def parse_web_config(text: str, path: Path) -> WebConfig:
    """The configuration in `text` (read from `path`, which relative paths in it are
    relative to); WebConfigError naming the file, line and key."""
    document = _document(text, path)
    top = _Section(path, "", document, None)
    top.refuse_unknown(TOP_KEYS)
    tls_section = top.section("tls_server_config")
    tls = _tls(tls_section)
    http = top.section("http_server_config")
    http.refuse_unknown(HTTP_KEYS)
    http2 = http.flag("http2", True)
    headers = _headers(http)
    users = _users(top)
    if tls is not None and http2 and tls.min_version < ssl.TLSVersion.TLSv1_3:
        names = tls_section.texts("cipher_suites")
        if names and not set(names) & set(HTTP2_REQUIRED_SUITES):
            raise tls_section.fail(
                "cipher_suites",
                f"with http2 on, node_exporter refuses a list without "
                f"{' or '.join(HTTP2_REQUIRED_SUITES)} (HTTP/2 requires one): add one, "
                "or set http_server_config.http2: false",
            )
    notes: list[str] = []
    if tls is not None and http2 and "http2" in http.mapping:
        notes.append(
            "http_server_config.http2: the agent answers HTTP/1.1 only (Python's "
            "http.server); a client offering HTTP/2 goes on in HTTP/1.1"
        )
    context = None
    if tls is not None:
        try:
            context = web_tls_context(tls)
        except ValueError as err:  # tls_context and pem_certificates name the file
            message = str(err)
            blamed = "cert_file"
            for key, named in (("key_file", tls.key_file), ("client_ca_file", tls.client_ca_file)):
                if named is not None and message.startswith(f"{named}:"):
                    blamed = key
            raise tls_section.fail(blamed, message) from None
        except ssl.SSLError as err:  # set_ciphers, set_ecdh_curve: checked above
            raise tls_section.fail("", f"OpenSSL refused it: {err.reason or err}") from None
    return WebConfig(
        source=path,
        tls=tls,
        http2=http2,
        headers=headers,
        users=users,
        context=context,
        notes=tuple(notes),
    )


def load_web_config(path: Path) -> WebConfig:
    """The file at `path` (made absolute: the agent's paths do not depend on where it
    was started), read bounded; WebConfigError naming the file, line and key."""
    path = path.absolute()
    try:
        text = read_text_file(path, WEB_CONFIG_LIMIT)
    except UnreadableFileError as err:
        raise WebConfigError(path, err.line, "", err.reason) from None
    return parse_web_config(text, path)
