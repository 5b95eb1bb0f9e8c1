"""Key rotation matrix for the field cipher: which keyring reads which value."""

from __future__ import annotations

import os

import pytest

from app.security import FieldCipher, FieldDecryptError

OLD, NEW = os.urandom(32), os.urandom(32)
ONLY_OLD = {"k1": OLD}
ROTATED = {"k2": NEW, "k1": OLD}  # new primary first, the old key kept for reading
ONLY_NEW = {"k2": NEW}


@pytest.mark.parametrize(("writer", "reader", "readable"), [
    (ONLY_OLD, ONLY_OLD, True),
    (ONLY_OLD, ROTATED, True),
    (ONLY_OLD, ONLY_NEW, False),   # old rows need the old key until rotated
    (ROTATED, ONLY_OLD, False),    # new rows are written with the new primary
    (ROTATED, ROTATED, True),
    (ROTATED, ONLY_NEW, True),
])
def test_old_new_key_matrix(writer, reader, readable):
    stored = FieldCipher(writer).encrypt("工资单 payroll", "t", "c", 7)
    if readable:
        assert FieldCipher(reader).decrypt(stored, "t", "c", 7) == "工资单 payroll"
    else:
        with pytest.raises(FieldDecryptError, match="unknown key id"):
            FieldCipher(reader).decrypt(stored, "t", "c", 7)


def test_rotation_rewrites_old_values_with_the_primary():
    old_value = FieldCipher(ONLY_OLD).encrypt("x", "t", "c", 1)
    rotated = FieldCipher(ROTATED)
    assert rotated.needs_rotation(old_value)
    fresh = rotated.encrypt(rotated.decrypt_bytes(old_value, "t", "c", 1), "t", "c", 1)
    assert not rotated.needs_rotation(fresh) and rotated.key_id_of(fresh) == "k2"
    assert FieldCipher(ONLY_NEW).decrypt(fresh, "t", "c", 1) == "x"


def test_same_key_id_with_another_key_fails_authentication():
    stored = FieldCipher({"k1": OLD}).encrypt("x", "t", "c", 1)
    with pytest.raises(FieldDecryptError, match="authentication failed"):
        FieldCipher({"k1": NEW}).decrypt(stored, "t", "c", 1)
