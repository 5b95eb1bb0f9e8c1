import base64
import os

import pytest

from app.security import BlindIndex, FieldCipher, FieldDecryptError


def key():
    return os.urandom(32)


def test_round_trip_and_random_nonce():
    cipher = FieldCipher({"k1": key()})
    a = cipher.encrypt("你好 😀", "t", "c", 1)
    b = cipher.encrypt("你好 😀", "t", "c", 1)
    assert a != b and a.startswith("v1:k1:")
    assert cipher.decrypt(a, "t", "c", 1) == "你好 😀"


@pytest.mark.parametrize("where", [("t", "c", 2), ("t", "other", 1), ("other", "c", 1)])
def test_value_moved_elsewhere_fails(where):
    cipher = FieldCipher({"k1": key()})
    stored = cipher.encrypt("secret", "t", "c", 1)
    with pytest.raises(FieldDecryptError):
        cipher.decrypt(stored, *where)


def test_tampered_value_fails():
    cipher = FieldCipher({"k1": key()})
    version, kid, blob = cipher.encrypt("secret", "t", "c", 1).split(":")
    raw = bytearray(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4)))
    raw[14] ^= 1
    forged = ":".join([version, kid, base64.urlsafe_b64encode(bytes(raw)).decode()])
    with pytest.raises(FieldDecryptError):
        cipher.decrypt(forged, "t", "c", 1)


def test_unknown_key_id_and_garbage():
    stored = FieldCipher({"k1": key()}).encrypt("x", "t", "c", 1)
    with pytest.raises(FieldDecryptError, match="unknown key id"):
        FieldCipher({"k2": key()}).decrypt(stored, "t", "c", 1)
    for garbage in ("", "plain text", "v9:k1:abc", "v1:k1:!!"):
        with pytest.raises(FieldDecryptError):
            FieldCipher({"k1": key()}).decrypt(garbage, "t", "c", 1)


def test_rotation_reads_old_writes_new():
    old, new = key(), key()
    stored_old = FieldCipher({"old": old}).encrypt("x", "t", "c", 1)
    rotated = FieldCipher({"new": new, "old": old})
    assert rotated.decrypt(stored_old, "t", "c", 1) == "x"
    assert rotated.needs_rotation(stored_old)
    assert rotated.key_id_of(rotated.encrypt("x", "t", "c", 1)) == "new"


def test_blind_index_is_keyed_and_domain_separated():
    a, b = BlindIndex(b"k" * 32), BlindIndex(b"j" * 32)
    assert a("user", "zhangwei") == a("user", "zhangwei")
    assert a("user", "zhangwei") != b("user", "zhangwei")
    assert a("user", "zhangwei") != a("dedup", "zhangwei")


def test_values_are_plain_gcm_readable_by_any_implementation():
    """Rows written before the switch to `cryptography` (pycryptodome's GCM) still decrypt, and
    new values decrypt with pycryptodome: the stored bytes are nonce || ciphertext || tag."""
    from Crypto.Cipher import AES

    secret, aad = key(), b"inbound_messages.payload_enc:42"
    nonce = os.urandom(12)
    old = AES.new(secret, AES.MODE_GCM, nonce=nonce)
    old.update(aad)
    ciphertext, tag = old.encrypt_and_digest("工资单 payroll".encode())
    stored = "v1:k1:" + base64.urlsafe_b64encode(nonce + ciphertext + tag).decode().rstrip("=")
    cipher = FieldCipher({"k1": secret})
    assert cipher.decrypt(stored, "inbound_messages", "payload_enc", 42) == "工资单 payroll"

    raw = cipher.encrypt("新值", "inbound_messages", "payload_enc", 42).split(":", 2)[2]
    raw = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    reader = AES.new(secret, AES.MODE_GCM, nonce=raw[:12])
    reader.update(aad)
    assert reader.decrypt_and_verify(raw[12:-16], raw[-16:]).decode() == "新值"
