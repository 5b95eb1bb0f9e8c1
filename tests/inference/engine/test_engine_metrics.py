"""The worker's scrape-time collectors read the real engine and speculative decoder."""

from prometheus_client import CollectorRegistry, generate_latest

from inference.sampling_params import SamplingParams
from tests.inference.engine.conftest import engine_for
from tests.inference.helpers import glm5_config, write_checkpoint
from worker.observability.metrics import EngineCollector, SpeculativeCollector


def scrape(collector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    values = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_kv_cache_blocks_follow_the_running_requests(model):
    engine = engine_for(model, num_blocks=32, block_size=4)
    collector = EngineCollector(lambda: engine)
    idle = scrape(collector)
    assert idle['wecom_bot_kv_cache_blocks{pool="kv",state="used"}'] == 0
    total = idle['wecom_bot_kv_cache_blocks{pool="kv",state="free"}']
    assert total == 32
    engine.add_request(list(range(3, 30)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.step()
    busy = scrape(collector)
    used = busy['wecom_bot_kv_cache_blocks{pool="kv",state="used"}']
    assert used > 0 and used + busy['wecom_bot_kv_cache_blocks{pool="kv",state="free"}'] == total
    assert busy['wecom_bot_engine_requests{state="running"}'] == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert scrape(collector)['wecom_bot_engine_requests{state="running"}'] == 0


def test_no_engine_loaded_means_no_series():
    assert scrape(EngineCollector(lambda: None)) == {}


def test_speculative_acceptance_per_position_and_length(tmp_path):
    from inference.llm import LLM

    llm = LLM.from_pretrained(write_checkpoint(tmp_path / "m", glm5_config(num_mtp_heads=2)), kv_cache_bytes=1 << 24)
    llm.generate([list(range(5, 15))], SamplingParams(temperature=0, max_tokens=25, ignore_eos=True), speculative_k=3)
    stats = llm.speculative_stats
    values = scrape(SpeculativeCollector(lambda: [stats]))
    for i in range(3):
        assert values[f'wecom_bot_speculative_proposed_total{{position="{i}"}}'] == stats.proposed[i]
        assert values[f'wecom_bot_speculative_accepted_total{{position="{i}"}}'] == stats.accepted[i]
    assert values["wecom_bot_speculative_accepted_length_count"] == stats.rounds
    assert values["wecom_bot_speculative_accepted_length_sum"] == stats.emitted - stats.rounds
    assert values['wecom_bot_speculative_accepted_length_bucket{le="0.0"}'] == stats.length_counts[0]
    assert sum(stats.length_counts) == stats.rounds
