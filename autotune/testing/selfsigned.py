"""A self-signed TLS certificate for a server on this machine (tests and the docs' examples).

Made with the `cryptography` package when it is installed (vLLM's environment has it),
else with the openssl binary. The certificate names localhost, 127.0.0.1 and ::1.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
from pathlib import Path


def make_self_signed(folder: Path, name: str = "server") -> tuple[Path, Path]:
    """Write folder/name.key and folder/name.crt (valid for 2 days); return (keyfile, certfile)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keyfile, certfile = folder / f"{name}.key", folder / f"{name}.crt"
    try:
        _with_cryptography(keyfile, certfile)
    except ImportError:
        if shutil.which("openssl") is None:
            raise RuntimeError("making a certificate needs the cryptography package or the openssl binary") from None
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-keyout", str(keyfile), "-out", str(certfile), "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"],
                       check=True, capture_output=True)
    keyfile.chmod(0o600)
    return keyfile, certfile


def _with_cryptography(keyfile: Path, certfile: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
