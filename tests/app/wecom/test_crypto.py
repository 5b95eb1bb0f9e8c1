"""WXBizMsgCrypt: WeCom's public vectors plus every way a callback can be wrong."""

import base64
import json
import struct
from pathlib import Path

import pytest
from Crypto.Cipher import AES

from app.wecom import exceptions as exc
from app.wecom.crypto import WeComCrypto, decode_aes_key, extract_encrypt, pkcs7_pad, sign

VECTORS = json.loads((Path(__file__).parents[2] / "fixtures" / "wecom_vectors.json").read_text())
OFFICIAL = VECTORS["official_sbzhu_weworkapi_python"]
WECHATPY = VECTORS["wechatpy_tests_test_crypto"]


def official() -> WeComCrypto:
    return WeComCrypto(OFFICIAL["token"], OFFICIAL["encoding_aes_key"], OFFICIAL["receiveid"])


def wechatpy() -> WeComCrypto:
    return WeComCrypto(WECHATPY["token"], WECHATPY["encoding_aes_key"], WECHATPY["receiveid"])


def test_official_verify_url():
    v = OFFICIAL["verify_url"]
    assert official().verify_url(v["msg_signature"], v["timestamp"], v["nonce"], v["echostr"]) == v["expected_plaintext"]


def test_official_decrypt_xml():
    v = OFFICIAL["decrypt_xml"]
    xml = official().decrypt_message(v["post_body"], v["msg_signature"], v["timestamp"], v["nonce"])
    assert xml == v["expected_plaintext"]


def test_official_json_sample_bytes():
    v = OFFICIAL["decrypt_json_sample"]
    crypto = official()
    crypto.check_signature(v["msg_signature"], v["timestamp"], v["nonce"], v["encrypt"])
    # The sample's plaintext carries no receive id check we can predict; decrypt with the one it holds.
    raw = base64.b64decode(v["encrypt"])
    plain = AES.new(crypto.key, AES.MODE_CBC, iv=crypto.key[:16]).decrypt(raw)
    (length,) = struct.unpack(">I", plain[16:20])
    tail = plain[20 + length : -plain[-1]].decode()
    assert crypto.decrypt(v["encrypt"], receive_id=tail).decode() == v["expected_plaintext"]


def test_wechatpy_check_signature_and_negative():
    v = WECHATPY["check_signature"]
    assert wechatpy().verify_url(v["msg_signature"], v["timestamp"], v["nonce"], v["echostr"]) == v["expected_plaintext"]
    with pytest.raises(exc.ValidateSignatureError) as info:
        wechatpy().verify_url(v["msg_signature"], v["timestamp"], "437374424", v["echostr"])
    assert info.value.code == -40001


def test_wechatpy_decrypt_message_fields():
    from defusedxml import ElementTree

    v = WECHATPY["decrypt_message"]
    crypto = wechatpy()
    crypto.check_signature(v["msg_signature"], v["timestamp"], v["nonce"], v["encrypt"])
    root = ElementTree.fromstring(crypto.decrypt(v["encrypt"]))
    for field, value in v["expected_fields"].items():
        assert root.findtext(field) == value


def test_wechatpy_deterministic_encryption_vector():
    v = WECHATPY["encrypt_message_deterministic"]
    crypto = wechatpy()
    encrypt = crypto.encrypt(v["plaintext"], random16=v["random16"].encode())
    assert encrypt == v["expected_encrypt"]
    assert crypto.signature(v["timestamp"], v["nonce"], encrypt) == v["expected_msg_signature"]
    reply = crypto.encrypt_reply(v["plaintext"], v["timestamp"], v["nonce"], random16=v["random16"].encode())
    assert reply == v["expected_reply_xml_template"].format(
        encrypt=v["expected_encrypt"], sig=v["expected_msg_signature"], ts=v["timestamp"], nonce=v["nonce"])


def test_signature_is_sorted_sha1():
    assert sign("b", "a", "d", "c") == sign("d", "c", "b", "a")


@pytest.mark.parametrize("text", ["你好，世界", "emoji 😀🎉 mixed 中文", "", "x" * 1000])
def test_round_trip_unicode(text):
    crypto = official()
    assert crypto.decrypt(crypto.encrypt(text)).decode() == text


@pytest.mark.parametrize("size", range(0, 70))
def test_padding_at_every_block_boundary(size):
    """Plaintext lengths around 32-byte multiples: a full 32-byte pad block appears when aligned."""
    crypto = official()
    body = b"a" * size
    encrypted = base64.b64decode(crypto.encrypt(body))
    plain_len = 16 + 4 + size + len(crypto.receive_id)
    assert len(encrypted) == (plain_len // 32 + 1) * 32
    assert crypto.decrypt(base64.b64encode(encrypted).decode()) == body


def test_signature_case_and_whitespace_are_strict():
    """WeCom sends the SHA-1 in lower-case hex; any other spelling is not its signature."""
    v = OFFICIAL["verify_url"]
    for spelling in (v["msg_signature"] + " ", " " + v["msg_signature"], v["msg_signature"].upper(),
                     v["msg_signature"][:-1] + v["msg_signature"][-1].upper(), ""):
        assert spelling != v["msg_signature"]
        with pytest.raises(exc.ValidateSignatureError):
            official().verify_url(spelling, v["timestamp"], v["nonce"], v["echostr"])
    d = OFFICIAL["decrypt_xml"]
    with pytest.raises(exc.ValidateSignatureError):
        official().decrypt_message(d["post_body"], d["msg_signature"].upper(), d["timestamp"], d["nonce"])


@pytest.mark.parametrize("change", ["signature", "timestamp", "nonce"])
def test_decrypt_message_checks_the_signature(change):
    """A well-formed, correctly encrypted envelope with any signed value changed is refused:
    decryption succeeding is no proof that WeCom sent it."""
    d = dict(OFFICIAL["decrypt_xml"])
    d[{"signature": "msg_signature"}.get(change, change)] = {
        "signature": "0" * 40, "timestamp": str(int(d["timestamp"]) + 1), "nonce": d["nonce"] + "1"}[change]
    with pytest.raises(exc.ValidateSignatureError):
        official().decrypt_message(d["post_body"], d["msg_signature"], d["timestamp"], d["nonce"])


def test_tampered_ciphertext_is_rejected():
    crypto = official()
    raw = bytearray(base64.b64decode(crypto.encrypt("hello tamper")))
    raw[20] ^= 0x01  # flips bits in the length / body area
    with pytest.raises(exc.WeComCryptoError):
        crypto.decrypt(base64.b64encode(bytes(raw)).decode())


def test_wrong_key_is_rejected():
    encrypted = official().encrypt("secret")
    other = WeComCrypto("t", WECHATPY["encoding_aes_key"], OFFICIAL["receiveid"])
    with pytest.raises(exc.WeComCryptoError):
        other.decrypt(encrypted)


def test_wrong_corpid_is_rejected():
    encrypted = official().encrypt("hello")
    impostor = WeComCrypto(OFFICIAL["token"], OFFICIAL["encoding_aes_key"], "ww_other_corp")
    with pytest.raises(exc.ValidateCorpIdError) as info:
        impostor.decrypt(encrypted)
    assert info.value.code == -40005


def test_bad_padding_is_rejected():
    crypto = official()
    plain = b"\x00" * 16 + struct.pack(">I", 2) + b"hi" + crypto.receive_id.encode()
    padded = pkcs7_pad(plain)
    bad = padded[:-1] + b"\x21"  # 33 > block size
    raw = AES.new(crypto.key, AES.MODE_CBC, iv=crypto.key[:16]).encrypt(bad)
    with pytest.raises(exc.IllegalBufferError) as info:
        crypto.decrypt(base64.b64encode(raw).decode())
    assert info.value.code == -40008


def test_length_beyond_buffer_is_rejected():
    crypto = official()
    plain = b"\x00" * 16 + struct.pack(">I", 10_000) + b"hi"
    raw = AES.new(crypto.key, AES.MODE_CBC, iv=crypto.key[:16]).encrypt(pkcs7_pad(plain))
    with pytest.raises(exc.IllegalBufferError):
        crypto.decrypt(base64.b64encode(raw).decode())


@pytest.mark.parametrize("bad", ["not base64!!", "YWJj", ""])
def test_bad_base64_or_short_ciphertext(bad):
    with pytest.raises((exc.DecodeBase64Error, exc.DecryptAesError)):
        official().decrypt(bad)


@pytest.mark.parametrize("key", ["short", "x" * 42, "x" * 44, OFFICIAL["encoding_aes_key"][:-1] + "!", 123])
def test_illegal_aes_key(key):
    with pytest.raises(exc.IllegalAesKeyError) as info:
        decode_aes_key(key)
    assert info.value.code == -40004


@pytest.mark.parametrize("body", ["<xml>", "<xml></xml>", "<xml><Encrypt></Encrypt></xml>", "not xml",
                                  '<!DOCTYPE x [<!ENTITY a "b">]><xml><Encrypt>&a;</Encrypt></xml>'])
def test_envelope_parse_errors(body):
    with pytest.raises(exc.ParseXmlError) as info:
        extract_encrypt(body)
    assert info.value.code == -40002


def test_every_crypto_error_has_its_wecom_code():
    codes = {cls.code for cls in vars(exc).values()
             if isinstance(cls, type) and issubclass(cls, exc.WeComCryptoError) and cls is not exc.WeComCryptoError}
    assert codes == set(range(-40011, -40000))
