"""The files Flower's TLS and SuperNode authentication read, made with the ``cryptography`` package
(a dependency of ``flwr`` itself, so it is there wherever the ``flower`` extra is).

- ``make_tls_files``: a certificate authority (``ca.crt``, ``ca.key``) and the SuperLink's server
  certificate signed by it (``server.pem``, ``server.key``) with the host names/IPs the SuperNodes and
  ``flwr`` dial as subject alternative names. These are what ``flower-superlink --ssl-ca-certfile
  --ssl-certfile --ssl-keyfile`` and ``flower-supernode --root-certificates`` read.
- ``make_node_key``: one SuperNode's key pair in OpenSSH format on a NIST curve (P-384), as
  ``ssh-keygen -t ecdsa -b 384`` writes it: the private key for ``flower-supernode
  --auth-supernode-private-key``, the public key for ``flwr supernode register``.

For the local federation and for a trial; a hospital deployment takes its certificates from its own
PKI (docs/federation.md). Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Short-lived: these certificates exist for one test or trial; a day covers clock skew and a long run.
VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    private: Path
    public: Path


def _write_private(path: Path, data: bytes) -> None:
    # Created 0600 from the start (not chmod after writing): the key is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _subject_alt_names(hosts) -> list:
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


# Flower 1.42's SuperLink starts its own SuperExec, which dials the SuperLink at 127.0.0.1:<port>
# over the same TLS: a certificate without these names fails that handshake (only superlink.log says
# so) and no ServerApp ever starts. Every certificate made here names them besides the given hosts.
LOOPBACK = ("127.0.0.1", "localhost")


def make_tls_files(folder, hosts=LOOPBACK, days: float | None = None) -> TlsFiles:
    """A CA and a server certificate for ``hosts`` (IP addresses or DNS names: each address the
    SuperLink is dialled at must be one of them, or the TLS handshake fails) and for ``LOOPBACK``
    (the SuperLink's own SuperExec dials 127.0.0.1), written into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hosts = list(hosts)
    if not hosts:
        raise ValueError("make_tls_files: name at least one host the SuperLink is reached at")
    hosts += [host for host in LOOPBACK if host not in hosts]
    validity = VALIDITY if days is None else datetime.timedelta(days=days)
    # Back-dated a few minutes so a node whose clock is slightly behind still accepts it.
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedmedbench"),
            x509.NameAttribute(NameOID.COMMON_NAME, "fedmedbench federation CA"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedmedbench"),
                    x509.NameAttribute(NameOID.COMMON_NAME, hosts[0]),
                ]
            )
        )
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    files = TlsFiles(folder / "ca.crt", folder / "ca.key", folder / "server.pem", folder / "server.key")
    pem = serialization.Encoding.PEM
    files.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    _write_private(
        files.ca_key, ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    files.server_cert.write_bytes(server_cert.public_bytes(pem))
    _write_private(
        files.server_key, server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def make_node_key(folder, name: str) -> NodeKey:
    """``<folder>/<name>`` (private) and ``<folder>/<name>.pub`` (public), ECDSA P-384 in OpenSSH
    format: Flower's SuperNode reads only OpenSSH private keys and ``flwr supernode register`` only
    OpenSSH public keys on a NIST curve."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    files = NodeKey(folder / name, folder / f"{name}.pub")
    _write_private(
        files.private,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    files.public.write_bytes(public + f" fedmedbench-{name}\n".encode())
    return files
