"""cli/predict_flags.py: the --predict flags override their config keys for one run, only those given."""
import main
from cli import predict_flags
from tiny import tiny_config


def test_the_sampling_flags_override_their_config_keys_and_only_those_given():
    """--no_kv_cache and --entmax_sampling are named otherwise than their keys (kv_cache, sampling_use_entmax) and
    turn them the other way or on; flags not given override nothing. Bug caught: --no_kv_cache setting kv_cache to
    True (decoding keeps the cache the flag asks to leave out)."""
    args = main.parse_args(["--predict", "--temperature", "0.5", "--top_k", "4", "--no_kv_cache", "--entmax_sampling",
                            "--remove_partial_sequences", "--no_compiled_decoding"])
    overrides = predict_flags.config_overrides(args)
    assert overrides == {"temperature": 0.5, "top_k": 4, "kv_cache": False, "sampling_use_entmax": True,
                         "remove_partial_sequences": True, "compiled_decoding": False}
    cfg = tiny_config(**overrides)
    assert (cfg.temperature, cfg.top_k, cfg.kv_cache, cfg.sampling_use_entmax, cfg.remove_partial_sequences,
            cfg.compiled_decoding) == (0.5, 4, False, True, True, False)
    assert predict_flags.config_overrides(main.parse_args(["--predict"])) == {}
