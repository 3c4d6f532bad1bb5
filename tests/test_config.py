"""Config loading: YAML problems and invalid values are one ConfigError line at load, never later."""

from __future__ import annotations

import pytest

from recsys_alibi.config import ConfigError, load_config


def _error(tmp_path, text: str | None = None, overrides: tuple[str, ...] = (), flags=None) -> str:
    path = None
    if text is not None:
        path = tmp_path / "job.yaml"
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, list(overrides), flags)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_yaml_syntax_errors_name_the_file_line_and_column(tmp_path):
    message = _error(tmp_path, "model:\n  d_model: 8\n n_heads: 2\n")
    assert message.startswith(f"{tmp_path / 'job.yaml'}: invalid YAML at line 3, column 2:")
    assert "indentation" in message
    assert _error(tmp_path, None, ("model.d_model=[",)).startswith("--set model.d_model=[: invalid YAML at line 1")


def test_python_object_tags_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    text = f"model: !!python/object/apply:os.system ['touch {marker}']\n"
    assert "tags that build Python objects are refused" in _error(tmp_path, text)
    assert "refused" in _error(tmp_path, None, (f"seed=!!python/object/apply:os.system ['touch {marker}']",))
    assert not marker.exists()


def test_a_key_given_twice_is_an_error_not_the_last_one_silently(tmp_path):
    message = _error(tmp_path, "model:\n  d_model: 8\n  d_model: 16\n")
    assert "line 3, column 3: key 'd_model' is given twice" in message


def test_a_config_that_is_not_utf8_or_is_a_directory_is_one_line(tmp_path):
    (tmp_path / "job.yaml").write_bytes("model:\n  position: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(tmp_path / "job.yaml")
    with pytest.raises(ConfigError, match="is a directory, not a YAML file"):
        load_config(tmp_path)


def test_section_written_without_keys_means_its_defaults_and_flags_still_apply(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("model:\ndata:\n  columns:\n")
    config = load_config(path, [], {"model.n_heads": ("--heads", 4)})
    assert config.model.n_heads == 4 and config.model.d_model == 64 and config.data.columns.user_id == "user_id"
    config = load_config(path, ["model.n_layers=3"])
    assert config.model.n_layers == 3


def test_a_flag_into_a_scalar_names_the_flag_not_a_set(tmp_path):
    message = _error(tmp_path, "model: 5\n", flags={"model.n_heads": ("--heads", 4)})
    assert message == "--heads (sets model.n_heads): cannot set model.n_heads because 'model' holds the value 5 in " \
        "the config, not a section of keys"
    assert "--set" not in message


def test_flag_values_are_not_read_as_yaml(tmp_path):
    assert load_config(None, [], {"output": ("--output", "2024")}).output == "2024"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.devices=abc", "invalid config at 'train.devices': Input should be a valid integer or 'auto' (got 'abc')"),
        ("train.devices=0", "invalid config at 'train.devices'"),
        ("train.accelerator=tpu", "invalid config at 'train.accelerator': Input should be 'auto', 'cpu', 'gpu', 'cuda' or 'mps'"),
        ("train.limit_train_batches=-1", "'train.limit_train_batches': must be a number of batches (an integer >= 1) or a fraction in (0, 1] (got -1)"),
        ("train.limit_train_batches=0", "'train.limit_train_batches': must be a number of batches"),
        ("train.limit_train_batches=1.5", "'train.limit_train_batches': must be a number of batches"),
        ("train.precision=half", "invalid config at 'train.precision'"),
        ("train.strategy=deepspeed", "invalid config at 'train.strategy'"),
        ("train.num_nodes=0", "invalid config at 'train.num_nodes'"),
        ("train.grad_clip=-1", "invalid config at 'train.grad_clip'"),
        ("train.val_users=0", "invalid config at 'train.val_users'"),
        ("train.lr=.inf", "invalid config at 'train.lr': Input should be a finite number (got inf)"),
        ("train.max_epochs=2.5", "invalid config at 'train.max_epochs': Input should be a valid integer (got 2.5)"),
        ("train.max_epochs=true", "invalid config at 'train.max_epochs': Input should be a valid integer (got True)"),
        ("model.bias_clamp=0", "invalid config at 'model.bias_clamp'"),
        ("model.max_bias=.nan", "invalid config at 'model.max_bias': Input should be a finite number"),
        ("score.device=gpu0", "invalid config at 'score.device': must be auto, cpu, cuda, cuda:N or mps (got 'gpu0')"),
        ("score.k=true", "invalid config at 'score.k'"),
        ("evaluate.ks=[10,0]", "invalid config at 'evaluate.ks': must be distinct integers >= 1"),
        ("evaluate.ks=[10,10]", "invalid config at 'evaluate.ks': must be distinct integers >= 1"),
        ("evaluate.ks=[]", "invalid config at 'evaluate.ks'"),
        ("evaluate.context_lengths=[0]", "invalid config at 'evaluate.context_lengths'"),
        ("evaluate.history_buckets=[50,20]", "invalid config at 'evaluate.history_buckets': bucket upper edges must be ascending"),
        ("seed=-1", "invalid config at 'seed'"),
        ("tracking.champion_alias=latest", "'latest' is reserved by the MLflow registry"),
        ("tracking.promotion_margin=.nan", "invalid config at 'tracking.promotion_margin'"),
    ],
)
def test_values_that_lightning_or_torch_would_refuse_later_are_refused_at_load(tmp_path, override, expected):
    assert expected in _error(tmp_path, None, (override,))


@pytest.mark.parametrize(
    "override",
    ["train.devices=2", "train.devices=auto", "train.accelerator=cpu", "train.limit_train_batches=3",
     "train.limit_train_batches=0.25", "train.precision=bf16-mixed", "train.precision=32", "train.strategy=ddp",
     "score.device=cuda:1", "train.grad_clip=null", "evaluate.ks=[1,10]"],
)
def test_values_lightning_accepts_still_load(override):
    load_config(None, [override])


def test_generate_range_is_checked():
    with pytest.raises(ConfigError, match="generate.min_events=50 is above generate.max_events=10"):
        load_config(None, ["generate.min_events=50", "generate.max_events=10"])


def test_exponent_floats_without_a_dot_are_numbers(tmp_path):
    (tmp_path / "job.yaml").write_text("train:\n  lr: 1e-3\n  weight_decay: 5E-2\n")
    config = load_config(tmp_path / "job.yaml", ["model.max_bias=+8e0"])
    assert (config.train.lr, config.train.weight_decay, config.model.max_bias) == (0.001, 0.05, 8.0)


def test_every_shipped_config_loads():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")):
        load_config(path)


def test_an_unknown_key_is_named_with_the_keys_of_its_section(tmp_path):
    message = _error(tmp_path, None, ("train.max_epoch=3",))
    assert message.startswith("invalid config at 'train.max_epoch': unknown key (did you mean 'max_epochs'?); "
                              "the keys there are accelerator, attention_health, ")
    far = _error(tmp_path, None, ("model.zzz=3",))  # nothing close: no guess
    assert far.startswith("invalid config at 'model.zzz': unknown key; the keys there are attention_backend, ")


def test_an_invalid_flag_value_names_the_flag(tmp_path):
    message = _error(tmp_path, None, (), {"score.k": ("--k", 0)})
    assert message == "invalid config at 'score.k': Input should be greater than or equal to 1 (got 0); it was given by --k"


def test_yaml_anchors_and_merge_keys_are_plain_yaml(tmp_path):
    (tmp_path / "job.yaml").write_text(
        "model: &small\n  d_model: 16\n  n_heads: 2\nscore:\n  k: 7\ntrain:\n  batch_size: 8\n"
    )
    config = load_config(tmp_path / "job.yaml")
    assert (config.model.d_model, config.model.n_heads, config.score.k) == (16, 2, 7)
    text = (
        "model:\n  <<: &base {d_model: 16, n_heads: 2}\n  n_layers: 3\n"
        "evaluate:\n  ks: &ks [5, 10]\n  context_lengths: *ks\n"
    )
    (tmp_path / "job.yaml").write_text(text)
    config = load_config(tmp_path / "job.yaml")
    assert (config.model.d_model, config.model.n_heads, config.model.n_layers) == (16, 2, 3)
    assert list(config.evaluate.ks) == [5, 10]
    # a key written beside a merge overrides the merged one (YAML merge rule), it is not "given twice"
    (tmp_path / "job.yaml").write_text("model:\n  <<: {d_model: 16, n_heads: 2}\n  d_model: 32\n")
    assert load_config(tmp_path / "job.yaml").model.d_model == 32
    # a key written twice by hand is still refused, merge or not
    assert "key 'd_model' is given twice" in _error(tmp_path, "model:\n  <<: {n_heads: 2}\n  d_model: 8\n  d_model: 16\n")


@pytest.mark.parametrize(
    "override",
    ["model.d_model=100000000000000000000000000", "train.max_epochs=99999999999999999999999",
     "score.k=9223372036854775808", "evaluate.ks=[10, 100000000000000000000]", "train.devices=99999999999999999999"],
)
def test_integers_beyond_64_bits_are_refused_at_load_not_by_torch(tmp_path, override):
    key = override.split("=")[0]
    message = _error(tmp_path, None, (override,))
    assert f"invalid config at '{key}" in message and "64-bit" in message


def test_integers_are_read_as_yaml_1_2_so_leading_zeros_are_decimal(tmp_path):
    (tmp_path / "job.yaml").write_text("score:\n  k: 010\nevaluate:\n  ks: [05, 1_000, 0x10, 0o10]\n")
    config = load_config(tmp_path / "job.yaml", ["train.max_epochs=08", "seed=-0"])
    assert (config.score.k, config.train.max_epochs, config.seed) == (10, 8, 0)  # YAML 1.1 read 010 as 8, 08 as text
    assert list(config.evaluate.ks) == [5, 1000, 16, 8]
    # YAML 1.1 sexagesimal (1:30 = 90) and binary are text now, so a strict integer key refuses them
    assert "invalid config at 'evaluate.temporal_cutoff'" in _error(tmp_path, None, ("evaluate.temporal_cutoff=1:30",))
    assert "invalid config at 'score.k'" in _error(tmp_path, None, ("score.k=0b11",))


def test_exclude_seen_is_one_setting_for_evaluation_and_serving(tmp_path):
    """Issue 31 defect 3: what is evaluated is what is served. The key given sets both sections; two
    different values are one error line."""
    from recsys_alibi.config import JobConfig, ScoreConfig, with_overrides

    for key in ("evaluate", "score"):
        config = load_config(None, [f"{key}.exclude_seen=false"])
        assert (config.evaluate.exclude_seen, config.score.exclude_seen) == (False, False)
    (tmp_path / "c.yaml").write_text("evaluate:\n  exclude_seen: false\nscore:\n  exclude_seen: true\n")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "c.yaml")
    assert str(caught.value) == (
        "invalid config at 'config': evaluate.exclude_seen=false and score.exclude_seen=true differ: they are one "
        "setting (what is evaluated is what is served); set one of them"
    )
    assert load_config(tmp_path / "c.yaml", ["score.exclude_seen=false"]).evaluate.exclude_seen is False
    assert with_overrides(JobConfig(), score={"exclude_seen": False}).evaluate.exclude_seen is False
    assert JobConfig(score=ScoreConfig(exclude_seen=False)).evaluate.exclude_seen is False
    assert JobConfig().evaluate.exclude_seen is JobConfig().score.exclude_seen is True


# a setting that takes effect only with another one is refused while that one is off (issue 31, defect 20)
IGNORED_UNLESS = [  # (the key given, shown as, the setting it needs, that setting on, the key at its default)
    ("model.slope_floor=zero", "model.slope_floor=zero", "model.learnable_slopes=true",
     "model.learnable_slopes=true", "model.slope_floor=positive"),
    ("model.long_context=4096", "model.long_context=4096", "model.slopes=wide", "model.slopes=wide",
     "model.long_context=2048"),
    ("model.lowpass_mix=0.5", "model.lowpass_mix=0.5", "model.lowpass_window >= 1", "model.lowpass_window=3",
     "model.lowpass_mix=0.7"),
    ("model.free_head_scale=log_beyond", "model.free_head_scale=log_beyond", "model.free_heads >= 1",
     "model.free_heads=1", "model.free_head_scale=none"),
    ("train.gbce_t=0.5", "train.gbce_t=0.5", "train.loss=gbce", "train.loss=gbce", "train.gbce_t=0.75"),
    ("train.zero_share_threshold=0.1", "train.zero_share_threshold=0.1", "train.attention_health=true",
     "train.attention_health=true", "train.zero_share_threshold=0.05"),
    ("train.warm.lr=0.0005", "train.warm", "train.init_from", "train.init_from=champion", "train.warm.lr=null"),
    ("evaluate.temporal_cutoff=5", "evaluate.temporal_cutoff=5", "evaluate.protocol=temporal",
     "evaluate.protocol=temporal", "evaluate.temporal_cutoff=null"),
    ("generate.distance=10", "generate.distance=10", "generate.task=long-range", "generate.task=long-range",
     "generate.distance=64"),
    # break-config-s66 finding 3: accepted, ignored, and logged as run params
    ("model.sinks=4", "model.sinks=4", "model.window", "model.window=16", "model.sinks=0"),
    ("model.max_len_cap=60", "model.max_len_cap=60", "model.max_len=auto", "model.max_len=auto",
     "model.max_len_cap=200"),
    ("model.max_len_quantile=0.1", "model.max_len_quantile=0.1", "model.max_len=auto", "model.max_len=auto",
     "model.max_len_quantile=0.75"),
]  # fmt: skip
PARENT_OFF = ("train.attention_health=false", "model.learnable_slopes=false")  # the others are off by default


@pytest.mark.parametrize(("given", "shown", "needs", "parent", "default"), IGNORED_UNLESS,
                         ids=[case[0] for case in IGNORED_UNLESS])  # fmt: skip
def test_a_setting_that_would_be_ignored_is_refused_naming_what_it_needs(tmp_path, given, shown, needs, parent,
                                                                         default):  # fmt: skip
    message = _error(tmp_path, None, (*PARENT_OFF, given))
    assert f"{shown} takes effect only with {needs}: set {needs}" in message
    assert load_config(None, [parent, given]) is not None  # in effect: accepted
    assert load_config(None, [*PARENT_OFF, default]) == load_config(None, list(PARENT_OFF))  # its default: accepted


def test_negative_or_repeated_heavy_user_slices_are_refused(tmp_path):
    assert "invalid config at 'evaluate.min_history': must be distinct integers >= 1 (got [-5])" in _error(
        tmp_path, None, ("evaluate.min_history=[-5]",)
    )
    assert "distinct" in _error(tmp_path, None, ("evaluate.min_history=[200, 200]",))
    assert load_config(None, ["evaluate.min_history=[]"]).evaluate.min_history == []


def test_a_dumped_config_with_every_key_at_its_default_loads_again():
    from recsys_alibi.config import JobConfig

    assert JobConfig.model_validate(JobConfig().model_dump()) == JobConfig()


# issue 41, defect 14: keys of ALiBi and of the sampled losses, given while that is off
DEPENDENT = [  # (the key given, the setting that switches it off, the setting it needs, that setting on)
    ("model.max_bias=4.0", "model.position=learned", "model.position=alibi and model.slopes=geometric",
     "model.position=alibi"),
    ("model.max_bias=4.0", "model.slopes=wide", "model.position=alibi and model.slopes=geometric", "model.slopes=geometric"),
    ("model.slopes=wide", "model.position=learned", "model.position=alibi", "model.position=alibi"),
    ("model.learnable_slopes=true", "model.position=learned", "model.position=alibi", "model.position=alibi"),
    ("model.free_heads=1", "model.position=none", "model.position=alibi", "model.position=alibi"),
    ("model.bias_clamp=4.0", "model.position=learned", "model.position=alibi", "model.position=alibi"),
    ("train.num_negatives=64", "train.loss=softmax", "train.loss=sampled_softmax or gbce", "train.loss=gbce"),
    ("train.num_negatives=64", "train.loss=bce", "train.loss=sampled_softmax or gbce", "train.loss=sampled_softmax"),
    ("train.zero_share_threshold=0.1", "model.position=learned", "model.position=alibi", "model.position=alibi"),
    ("data.separator=x", "data.format=parquet", "data.format=csv or auto", "data.format=csv"),
    ("data.has_header=false", "data.format=sasrec", "data.format=csv or auto", "data.format=auto"),
    ("data.timestamp_unit=ms", "data.format=s3rec", "a data.format with timestamps (not sasrec, s3rec)",
     "data.format=ndjson"),
    ("data.id_type=str", "data.format=parquet", "a data.format read as text (not parquet)", "data.format=movielens"),
]  # fmt: skip


def test_a_refused_tab_is_shown_as_an_escape_not_a_blank(tmp_path):
    message = _error(tmp_path, None, ("data.format=movielens", "data.separator=tab"))
    assert message.endswith("data.separator='\\t' takes effect only with data.format=csv or auto: set data.format=csv "
                            "or auto, or drop data.separator (on the command line: --set data.separator=null)")


def test_an_unquoted_bar_as_the_item_feature_separator_gets_the_quoting_hint(tmp_path):
    message = _error(tmp_path, None, ("data.item_features.separator=|",))  # YAML reads a bare '|' as ''
    assert message == ("invalid config at 'data.item_features.separator': the separator must not be empty; '|' and ',' "
                       "need YAML's quotes: --set \"data.item_features.separator='|'\" (null: values are never split) "
                       "(got '')")
    assert load_config(None, ["data.item_features.separator='|'"]).data.item_features.separator == "|"


@pytest.mark.parametrize(("given", "off", "needs", "on"), DEPENDENT, ids=[f"{c[0]}-{c[1]}" for c in DEPENDENT])
def test_a_dependent_key_is_refused_while_its_setting_is_off(tmp_path, given, off, needs, on):
    message = _error(tmp_path, None, (off, given))
    key = given.split("=")[0]
    head, _, fix = message.partition(" (on the command line: --set ")
    assert head.endswith(f"{given} takes effect only with {needs}: set {needs}, or drop {key}")
    assert fix.startswith(f"{key}=") and fix.endswith(")")
    assert load_config(None, [off, fix[:-1]]) is not None  # the command line's fix loads with the setting off
    assert load_config(None, [on, given]) is not None
    default = load_config(None, []).model_dump()  # its default value with the setting off: accepted
    section, name = key.split(".")
    assert load_config(None, [off, f"{key}={default[section][name]}".replace("None", "null")]) is not None


def test_the_shipped_configs_still_load_and_their_sasrec_baselines_say_what_to_drop(tmp_path):
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert configs and all(load_config(path) is not None for path in configs)
    default = configs[[p.name for p in configs].index("default.yaml")]
    with pytest.raises(ConfigError) as caught:  # the file's key: the command line gives it its default
        load_config(default, ["model.position=learned"])
    assert str(caught.value).endswith("model.free_heads=1 takes effect only with model.position=alibi: set "
                                      "model.position=alibi, or drop model.free_heads (on the command line: --set "
                                      "model.free_heads=0)")
    assert load_config(default, ["model.position=learned", "model.free_heads=0"]).model.position == "learned"


# issue 41, defect 9: a warm start's epochs against train.context_schedule, named by the key that sets them
WARM = ["train.init_from=champion", "train.max_epochs=8", "train.context_schedule=[[0, 4], [5, 8]]"]


def test_a_warm_schedule_that_never_reaches_the_last_window_names_train_warm_max_epochs(tmp_path):
    message = _error(tmp_path, None, tuple(WARM))
    assert message == (
        "invalid config at 'train.warm.max_epochs': a warm start (train.init_from=champion) trains 2 epochs "
        "(train.warm.max_epochs is unset: a quarter of train.max_epochs=8, rounded up), but train.context_schedule "
        "switches at epoch 5: the switch would never happen; set train.warm.max_epochs to at least 6, or switch earlier"
    )
    given = _error(tmp_path, None, (*WARM, "train.warm.max_epochs=5"))
    assert "trains 5 epochs (train.warm.max_epochs=5), but train.context_schedule switches at epoch 5" in given
    assert load_config(None, [*WARM, "train.warm.max_epochs=6"]).train.warm.max_epochs == 6
    assert load_config(None, WARM[1:]).train.max_epochs == 8  # cold: 8 epochs reach the switch at 5


def test_the_warm_schedule_applied_by_the_job_keeps_to_the_same_rule():
    from pipelines.init_from import warm_schedule

    warm = warm_schedule(load_config(None, [*WARM, "train.warm.max_epochs=6"])).train
    assert (warm.max_epochs, warm.context_schedule) == (6, [[0, 4], [5, 8]])
    quarter = warm_schedule(load_config(None, [*WARM[:2], "train.context_schedule=[[0, 4], [1, 8]]"])).train
    assert quarter.max_epochs == 2


@pytest.mark.parametrize("text", ["inf", ".inf", "INF", "+inf", "Infinity"])
def test_prior_weight_inf_is_the_weight_the_daily_pipeline_scores_inf_with(text):
    # the pipeline prints its choice as "weight inf"; typed back, it gives the weight its rankings used
    from recsys_alibi.evaluation.popularity_prior import INF_WEIGHT

    config = load_config(None, [f"score.popularity_prior.weight={text}"])
    assert config.score.popularity_prior.weight == INF_WEIGHT == 1000.0


@pytest.mark.parametrize("text, says", [("-inf", "valid number"), (".nan", "finite number"), ("-1", "greater than or equal to 0")])
def test_prior_weight_minus_inf_nan_and_negative_are_refused(text, says):
    with pytest.raises(ConfigError, match=f"score.popularity_prior.weight.*{says}"):
        load_config(None, [f"score.popularity_prior.weight={text}"])


@pytest.mark.parametrize(
    "text, seconds",
    [("1998-03-01", 888_710_400), ("'1998-03-01'", 888_710_400), ("1998-03-01 00:00:00", 888_710_400),
     ("1998-03-01T00:00:00Z", 888_710_400), ("1998-03-01T12:00:00+02:00", 888_710_400 + 10 * 3600),
     ("888710400", 888_710_400)],
)
def test_a_temporal_cutoff_is_seconds_or_an_iso_date_or_time(text, seconds):
    config = load_config(None, ["evaluate.protocol=temporal", f"evaluate.temporal_cutoff={text}"])
    assert config.evaluate.temporal_cutoff == seconds  # 1998-03-01 00:00 UTC = 888,710,400 s


def test_a_temporal_cutoff_that_is_no_time_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["evaluate.protocol=temporal", "evaluate.temporal_cutoff=soon"])
    assert str(err.value) == ("invalid config at 'evaluate.temporal_cutoff': expected seconds since the epoch or an "
                              "ISO-8601 date or time (got 'soon')")


# break-config-s66 (findings 2, 3, 5, 6, 9, 10, 11)
def test_a_non_scalar_mapping_key_is_invalid_yaml_not_a_type_error(tmp_path):
    # `? [a]` gave a TypeError traceback (unhashable type: 'list'), exit 1
    assert _error(tmp_path, "? [a]\n: 1\n") == (f"{tmp_path / 'job.yaml'}: invalid YAML at line 1, column 3: a mapping "
                                                "key must be a plain value (a name), not a list")
    assert _error(tmp_path, "model:\n  ? {a: 1}\n  : 2\n").endswith("line 2, column 5: a mapping key must be a plain "
                                                                  "value (a name), not a mapping")
    assert _error(tmp_path, None, ("model={[a]: 1}",)) == (
        "--set model={[a]: 1}: invalid YAML at line 1, column 2: a mapping key must be a plain value (a name), not a list")


def test_a_section_given_as_a_mapping_says_which_keys_go_back_to_their_defaults(tmp_path, caplog):
    path = tmp_path / "job.yaml"
    path.write_text("model: {d_model: 16, n_heads: 2, max_len: 50}\n")
    config = load_config(path, ["model={dropout: 0.1}"])
    assert (config.model.d_model, config.model.max_len, config.model.dropout) == (64, 200, 0.1)  # as given: replaced
    assert caplog.messages == [
        f"--set model={{dropout: 0.1}} gives model as a whole: model.d_model, model.n_heads, model.max_len (from {path}) "
        "go back to their defaults; give them in the mapping too, or set single keys with --set model.KEY=VALUE"]
    caplog.clear()
    load_config(path, ["model.n_layers=3", "model={d_model: 16, n_heads: 2, max_len: 60}"])
    assert caplog.messages == [
        "--set model={d_model: 16, n_heads: 2, max_len: 60} gives model as a whole: model.n_layers (from --set "
        "model.n_layers=3) goes back to its default; give it in the mapping too, or set single keys with --set "
        "model.KEY=VALUE"]


def test_a_set_of_a_key_inside_a_mapping_warns_as_a_key_given_twice(tmp_path, caplog):
    config = load_config(None, ["model.n_heads=4", "model={n_heads: 8}"])
    assert config.model.n_heads == 8
    assert caplog.messages == ["--set model.n_heads given twice: 'model={n_heads: 8}' replaces 'model.n_heads=4'"]
    caplog.clear()
    assert load_config(None, ["model={n_heads: 8}", "model.n_heads=4"]).model.n_heads == 4
    assert caplog.messages == ["--set model.n_heads given twice: 'model.n_heads=4' replaces 'model={n_heads: 8}'"]
    caplog.clear()
    load_config(None, ["model.n_heads=4", "model.n_heads=4", "model.n_layers=3"])  # the same text again: no news
    assert caplog.messages == []


def test_an_empty_mapping_still_clears_a_section_without_a_warning(tmp_path, caplog):
    path = tmp_path / "job.yaml"
    path.write_text("data:\n  items: t.parquet\n  item_features: {categorical: [topic]}\n")
    config = load_config(path, ["data.item_features={}", "data.items=null"])
    assert config.data.item_features.columns == [] and caplog.messages == []
    load_config(path, ["data.item_features.numeric=[year]", "data.item_features={}", "data.items=null"])
    assert caplog.messages == [  # an earlier --set it drops is still said
        "--set data.item_features={} gives data.item_features as a whole: data.item_features.numeric (from --set "
        "data.item_features.numeric=[year]) goes back to its default; give it in the mapping too, or set single keys "
        "with --set data.item_features.KEY=VALUE"]


def test_a_flag_over_a_set_of_its_key_says_so(caplog):
    config = load_config(None, ["generate.users=7"], {"generate.users": ("--users", 5)})
    assert config.generate.users == 5
    assert caplog.messages == ["--users sets generate.users=5 over --set generate.users=7: a flag wins over a --set of "
                               "its key; give one of them"]
    caplog.clear()
    load_config(None, [], {"generate.users": ("--users", 5)})  # over the file or a default: what flags are for
    assert caplog.messages == []


def test_prior_half_life_without_weight_or_choice_is_refused(tmp_path):
    message = _error(tmp_path, None, ("score.popularity_prior.choose=false", "score.popularity_prior.half_life_days=3"))
    assert message == (
        "invalid config at 'score.popularity_prior': score.popularity_prior.half_life_days=3.0 takes effect only with "
        "score.popularity_prior.weight > 0 or score.popularity_prior.choose=true: set score.popularity_prior.weight > "
        "0 or score.popularity_prior.choose=true, or drop score.popularity_prior.half_life_days (on the command line: "
        "--set score.popularity_prior.half_life_days=7.0)")
    for on in ("score.popularity_prior.weight=0.5", "score.popularity_prior.choose=true"):
        load_config(None, ["score.popularity_prior.choose=false", on, "score.popularity_prior.half_life_days=3"])


def test_the_max_len_rule_keys_stay_with_the_number_train_resolves_auto_to():
    from recsys_alibi.config import with_overrides

    given = load_config(None, ["model.max_len=auto", "model.max_len_cap=1000", "model.max_len_quantile=0.9"])
    assert with_overrides(given, model={"max_len": 300}).model.max_len_cap == 1000  # resolve_max_len's copy


@pytest.mark.parametrize(("override", "message"), [
    ("tracking.registered_model=a/b", "invalid config at 'tracking.registered_model': a registered model name cannot "
     "hold '/' (MLflow refuses '/' and ':', and '@' would end the name in models:/NAME@ALIAS); choose another name "
     "(got 'a/b')"),
    ("tracking.registered_model=a:b", "invalid config at 'tracking.registered_model': a registered model name cannot "
     "hold ':' (MLflow"),
    ("tracking.registered_model=a@b", "invalid config at 'tracking.registered_model': a registered model name cannot "
     "hold '@' (MLflow"),
    ("tracking.registered_model=' '", "invalid config at 'tracking.registered_model': the registered model name must "
     "not be empty or only whitespace (got ' ')"),
    ("tracking.registered_model=''", "invalid config at 'tracking.registered_model': the registered model name must "
     "not be empty"),
    ("tracking.registered_model=..", "invalid config at 'tracking.registered_model': '..' is no registered model name "
     "MLflow takes; choose another name"),
    (f"tracking.registered_model={'m' * 257}", "invalid config at 'tracking.registered_model': the registered model "
     "name has 257 characters; the registry takes at most 256"),
    (f"tracking.champion_alias={'a' * 256}", "invalid config at 'tracking.champion_alias': the alias has 256 "
     "characters; MLflow takes at most 255"),
    ("tracking.experiment=''", "invalid config at 'tracking.experiment': the experiment name must not be empty or "
     "only whitespace (got '')"),
    ("tracking.experiment='  '", "invalid config at 'tracking.experiment': the experiment name must not be empty"),
    (f"tracking.experiment={'e' * 501}", "invalid config at 'tracking.experiment': the experiment name has 501 "
     "characters; MLflow takes at most 500"),
    ("tracking.promotion_margin=-0.01", "invalid config at 'tracking.promotion_margin': Input should be greater than "
     "or equal to 0 (got -0.01)"),
])  # fmt: skip
def test_tracking_names_mlflow_would_refuse_after_training_are_refused_at_load(tmp_path, override, message):
    assert _error(tmp_path, None, (override,)).startswith(message)


def test_tracking_names_mlflow_takes_still_load():
    config = load_config(None, ["tracking.registered_model=ranker-v2.daily_1", f"tracking.champion_alias={'a' * 255}",
                                "tracking.experiment=my runs", "tracking.promotion_margin=0.001"])  # fmt: skip
    assert config.tracking.registered_model == "ranker-v2.daily_1"


@pytest.mark.parametrize(("override", "message"), [
    ("tracking.experiment=2024", "invalid config at 'tracking.experiment': Input should be a valid string (got 2024: "
     "YAML reads it as a number; quote the value to give text, e.g. --set \"tracking.experiment='2024'\")"),
    ("tracking.registered_model=on", "invalid config at 'tracking.registered_model': Input should be a valid string "
     "(got true: YAML reads true, false, yes, no, on and off as booleans; quote the value to give text, e.g. --set "
     "\"tracking.registered_model='...'\")"),
    ("data.item_features.categorical=[1]", "invalid config at 'data.item_features.categorical': Input should be a "
     "valid string (got 1: YAML reads it as a number; quote the value to give text)"),
])  # fmt: skip
def test_a_text_key_given_a_yaml_number_or_boolean_says_to_quote_it(tmp_path, override, message):
    assert _error(tmp_path, None, (override,)) == message
    assert load_config(None, ["tracking.experiment='2024'"]).tracking.experiment == "2024"


def test_a_sub_key_of_a_single_value_says_so(tmp_path):
    # it read "invalid config at 'model.d_model': Input should be a valid integer", with no value shown
    expected = ("--set model.d_model.x=3: cannot set model.d_model.x: a sub-key was set on a single value "
                "('model.d_model' is one value, not a section of keys); set it as model.d_model=VALUE")
    assert _error(tmp_path, None, ("model.d_model.x=3",)) == expected
    assert _error(tmp_path, "model: {d_model: 8}\n", ("model.d_model.x=3",)) == expected
    ranges = load_config(None, ["data.items=t.parquet", "data.item_features.numeric=[year]",
                                "data.item_features.ranges.year=[1900, 2030]"])  # a mapping key: sub-keys are its own
    assert ranges.data.item_features.ranges == {"year": [1900.0, 2030.0]}


def test_a_warm_start_uri_with_a_trailing_slash_names_the_fix(tmp_path):
    assert _error(tmp_path, None, ("train.init_from=runs:/abc/model/",)) == (
        "invalid config at 'train.init_from': must be runs:/RUN_ID/model, models:/NAME/VERSION, models:/NAME@ALIAS or "
        "champion (without the trailing '/': runs:/abc/model) (got 'runs:/abc/model/')")
