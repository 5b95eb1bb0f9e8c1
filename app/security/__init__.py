"""Data protection: field encryption (AES-256-GCM with a keyring) and blind indexes."""

from app.security.blind_index import BlindIndex
from app.security.fieldcrypt import FieldCipher, FieldDecryptError

__all__ = ["BlindIndex", "FieldCipher", "FieldDecryptError"]
