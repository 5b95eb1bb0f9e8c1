"""Data protection (app/security): the field cipher's keyring, the blind index's keys, and
the server secret (Flask sessions, fingerprints, the audit chain's seals)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PrivateAttr, SecretStr, model_validator

from app.config.base import SettingsGroup
from app.config.secret_fields import (
    BLIND_INDEX,
    KEYRING,
    PREVIOUS_KEYS,
    RANDOM,
    parse_keyring,
    split_blind_index_keys,
    split_list,
)


class DataProtectionSettings(SettingsGroup):
    data_keys: Annotated[SecretStr, KEYRING] = Field(
        description="keyring: 'kid:base64(32 bytes),...', primary first")
    blind_index_key: Annotated[SecretStr, BLIND_INDEX] = Field(
        description="HMAC keys of the blind indexes and API-key digests: 'NEW,OLD', current first "
                    "(lookups try each; 'keys rotate-index' moves every index to the first)")
    _blind_index_older: list[str] = PrivateAttr(default_factory=list)
    secret_key: Annotated[SecretStr, RANDOM] = Field(
        description="server secret: Flask sessions, fingerprints")
    secret_key_previous: Annotated[SecretStr, PREVIOUS_KEYS] = Field(
        default=SecretStr(""),
        description="earlier SECRET_KEYs, comma-separated, newest first: audit rows and exports "
                    "sealed before a rotation still verify ('keys rotate' re-seals the chain)")

    @model_validator(mode="after")
    def _blind_index_current_key(self):
        # ``blind_index_key`` keeps the current key alone (what every writer and the knowledge
        # base's term hashes use); the older ones are only for lookups until ``rotate-index``.
        keys = split_blind_index_keys(self.blind_index_key.get_secret_value())
        self.blind_index_key = SecretStr(keys[0])
        self._blind_index_older = keys[1:]
        return self

    @property
    def blind_index_keys(self) -> list[str]:
        """BLIND_INDEX_KEY's keyring, current first: lookups try each, writes use the first."""
        return [self.blind_index_key.get_secret_value(), *self._blind_index_older]

    @property
    def previous_secret_keys(self) -> list[str]:
        return split_list(self.secret_key_previous.get_secret_value())

    @property
    def keyring(self) -> dict[str, bytes]:
        return parse_keyring(self.data_keys.get_secret_value())
