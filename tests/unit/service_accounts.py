"""A Google service account file for fence.auth's real-mode verifiers in unit tests: a fresh
RSA key no Google server knows, syntactically valid (firebase-admin resolves it at start)."""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def service_account_file(directory: Path, project: str) -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path = directory / "service-account.json"
    path.write_text(json.dumps({
        "type": "service_account", "project_id": project, "private_key_id": "unit", "private_key": pem,
        "client_email": f"unit@{project}.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token"}))
    return path
