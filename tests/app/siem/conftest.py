"""The SIEM tests' receivers: a syslog receiver and an OTLP collector, both on TLS with a CA the
test makes, both asking for the exporter's client certificate."""

import pytest

from tests.support.siem_receivers import OtlpCollector, SyslogReceiver, make_pki


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


@pytest.fixture
def receivers(pki):
    syslog = SyslogReceiver(pki, require_client_cert=True).start()
    otlp = OtlpCollector(pki, require_client_cert=True).start()
    yield syslog, otlp
    syslog.stop()
    otlp.stop()
