"""Throwaway certificates for one local cluster.

Why: kube-apiserver only serves TLS and authenticates clients by certificate (or token), and
the controller-manager signs service-account tokens with a key the apiserver must trust. A
fresh CA per cluster keeps every cluster self-contained; nothing here is ever trusted outside
its work dir. ECDSA P-256 keys are used because they are generated in microseconds, and every
component (including service-account signing, ES256) accepts them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_DNS_NAMES = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files written by `make_pki`."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
    )


def make_pki(directory: Path, service_ip: str) -> Pki:
    """Write a CA, an apiserver serving cert, an admin client cert and a service-account key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        *(
            directory / n
            for n in (
                "ca.crt",
                "ca.key",
                "apiserver.crt",
                "apiserver.key",
                "admin.crt",
                "admin.key",
                "sa.key",
                "sa.pub",
            )
        )
    )
    ca_key = _key()
    ca_name = _name("finetune-localcluster-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.ca_key, ca_key)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(
        cert_path: Path,
        key_path: Path,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> None:
        key = _key()
        builder = (
            _builder(subject, ca_name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write_key(key_path, key)
        cert_path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVICE_DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip)]
    leaf(pki.serving_cert, pki.serving_key, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans)
    leaf(pki.admin_cert, pki.admin_key, _name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki
