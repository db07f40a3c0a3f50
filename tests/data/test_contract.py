"""The data contract (tvq_exp.batch.DataContract): every data preset's module offers it, and only the probes
have answer buckets (the model's accuracy metrics and the callbacks ask the contract, not the class)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from tests.helpers.paths import CONF
from tvq_exp.batch import DataContract, DataKind

DATA = sorted(p.stem for p in (CONF / "data").glob("*.yaml"))
REQUIRED = {
    "hf": ["data.corpus.path=unused"],
    "text_files": ["data.corpus.path=unused"],
}  # presets with a required option (???)


@pytest.mark.parametrize("name", DATA)
def test_every_data_preset_offers_the_contract(name: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"data={name}", *REQUIRED.get(name, [])])
    data = instantiate(cfg.data)  # cheap: no file is read before setup()
    assert isinstance(data, DataContract)
    assert isinstance(data.kind, DataKind) and data.kind == cfg.data.kind
    assert (data.vocab_size, data.seq_len, data.batch_size) == (
        cfg.data.vocab_size,
        cfg.data.seq_len,
        cfg.data.batch_size,
    )
    assert data.context_len >= data.seq_len
    names = data.bucket_names("validation")
    assert bool(names) == (data.kind is DataKind.SYNTHETIC), names  # answer buckets: the probes only
    data.check_accumulation(1)
