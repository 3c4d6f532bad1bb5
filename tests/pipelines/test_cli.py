"""The command line: config and output-path problems are one ``error:`` line and the right exit code."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from pipelines.cli import main
from recsys_alibi import atomic


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


@pytest.fixture
def yaml_files(tmp_path):
    files = {
        "indent": "model:\n  d_model: 8\n n_heads: 2\n",
        "tag": f"model: !!python/object/apply:os.system ['touch {tmp_path / 'ran'}']\n",
        "twice": "train:\n  max_epochs: 1\n  max_epochs: 2\n",
    }
    for name, text in files.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("command", [
    ["pipeline"], ["train"], ["prepare", "--input", "x.csv"], ["generate"], ["diagnose", "--heads", "4"],
    ["evaluate", "--baseline", "popularity"], ["score", "--model-uri", "runs:/x/model"],
])  # fmt: skip
@pytest.mark.parametrize("name", ["indent", "tag", "twice"])
def test_yaml_errors_are_user_errors_in_every_command(yaml_files, monkeypatch, capsys, command, name):
    monkeypatch.chdir(yaml_files)
    assert main([*command, "--config", f"{name}.yaml"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {name}.yaml: invalid YAML at line ")
    assert not (yaml_files / "ran").exists() and not (yaml_files / "runs").exists()


def test_bad_yaml_in_a_set_override_is_a_user_error_in_the_pipeline(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["pipeline", "--set", "model.d_model=["]) == 2
    assert _one_error_line(capsys).startswith("error: --set model.d_model=[: invalid YAML at line 1, column 2")


@pytest.mark.parametrize("override", ["train.devices=abc", "train.accelerator=tpu", "train.limit_train_batches=-1"])
def test_trainer_settings_are_refused_before_training(tmp_path, monkeypatch, capsys, override):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--prepared", str(tmp_path / "none"), "--set", override]) == 2
    assert _one_error_line(capsys).startswith(f"error: invalid config at '{override.split('=')[0]}'")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_gpu_accelerator_without_a_gpu_is_refused_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--prepared", str(tmp_path / "none"), "--set", "train.accelerator=gpu"]) == 2
    assert _one_error_line(capsys) == (
        "error: train.accelerator=gpu with train.devices=1 needs 1 CUDA device(s), this machine has 0; use "
        "train.accelerator=auto or cpu"
    )


def test_null_model_section_with_heads_flag_is_its_defaults(tmp_path, capsys):
    (tmp_path / "job.yaml").write_text("model:\n")
    assert main(["diagnose", "--config", str(tmp_path / "job.yaml"), "--heads", "4", "--max-len", "64",
                 "--dtype", "float32"]) == 0  # fmt: skip
    assert "0/4 heads blind" in capsys.readouterr().out
    (tmp_path / "scalar.yaml").write_text("model: 5\n")
    assert main(["diagnose", "--config", str(tmp_path / "scalar.yaml"), "--heads", "4"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: --heads (sets model.n_heads): cannot set model.n_heads because 'model' holds")
    assert "--set" not in line


@pytest.mark.parametrize("command", [
    ["generate", "--users", "5", "--items", "5"], ["diagnose", "--heads", "2", "--max-len", "8"],
])  # fmt: skip
def test_file_output_naming_a_folder_is_refused(tmp_path, capsys, command):
    folder = tmp_path / "out"
    (folder / "keep").mkdir(parents=True)
    assert main([*command, "--output", str(folder)]) == 2
    assert _one_error_line(capsys).startswith(f"error: --output {folder} is a directory, but a file is written there")
    assert [p.name for p in folder.iterdir()] == ["keep"]


@pytest.mark.parametrize("command", [
    ["prepare", "--input", "events.csv"], ["evaluate", "--baseline", "popularity"], ["pipeline"],
    ["score", "--model-uri", "runs:/x/model"],
])  # fmt: skip
def test_folder_output_naming_an_existing_file_is_refused_and_the_file_kept(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events.csv").write_text("user_id,item_id,timestamp\nu,i,1\n")
    target = tmp_path / "taken.parquet"
    target.write_bytes(b"precious")
    assert main([*command, "--output", str(target)]) == 2
    assert _one_error_line(capsys).startswith(f"error: --output {target} is a file, but a directory is written there")
    assert target.read_bytes() == b"precious"


def test_output_below_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "plain").write_text("x")
    assert main(["generate", "--users", "5", "--items", "5", "--output", str(tmp_path / "plain" / "e.parquet")]) == 2
    assert _one_error_line(capsys) == f"error: --output {tmp_path / 'plain' / 'e.parquet'}: {tmp_path / 'plain'} is a " \
        "file, not a directory; choose another path"


def test_read_only_output_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(folder) else real_access(path, mode))
    assert main(["generate", "--users", "5", "--items", "5", "--output", str(folder / "events.parquet")]) == 2
    assert "cannot write in" in _one_error_line(capsys) and list(folder.iterdir()) == []


def _failing_temp(err_no: int):
    def fail(path, **kwargs):
        raise OSError(err_no, os.strerror(err_no), str(path.parent / f".{path.name}.abc.tmp"))

    return fail


@pytest.mark.parametrize(
    ("command", "name", "err_no", "code", "expected"),
    [  # a folder made read-only (or a read-only file system) after the checks; a disk that fills up
        (["generate", "--users", "5", "--items", "5"], "events.parquet", errno.EACCES, 2,
         "error: Permission denied: {dir}/events.parquet; choose another path or fix its permissions"),
        (["diagnose", "--heads", "2", "--max-len", "8"], "diagnosis.json", errno.ENOSPC, 1,
         "error: cannot write {dir}/diagnosis.json: No space left on device; what was being written was discarded and every output "
         "is as it was before that write; free space and run the same command again"),
    ],
)  # fmt: skip
def test_a_failed_write_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch, capsys, command, name, err_no, code,
                                                          expected):  # fmt: skip
    target = tmp_path / name
    assert main([*command, "--output", str(target)]) == 0
    before = target.read_bytes()
    capsys.readouterr()
    monkeypatch.setattr(atomic, "held_temp", _failing_temp(err_no))
    assert main([*command, "--output", str(target)]) == code
    assert _one_error_line(capsys) == expected.format(dir=tmp_path)
    assert target.read_bytes() == before


def _events_folder(folder):
    folder.mkdir()
    lines = ["user_id,item_id,timestamp"] + [f"u{u},i{(u + j) % 4},{10 * j + u}" for u in range(3) for j in range(4)]
    (folder / "day1.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize("where", ["same", "below", "glob", "link"])
def test_prepare_output_inside_its_input_folder_is_refused_before_writing(tmp_path, capsys, where):
    events = _events_folder(tmp_path / "events")
    (tmp_path / "link").symlink_to(events)
    output = {"same": events, "below": events / "prepared", "glob": events / "prepared", "link": tmp_path / "link" / "p"}
    given = str(events / "*.csv") if where == "glob" else str(events)
    args = ["prepare", "--input", given, "--output", str(output[where]), "--set", "data.min_events_per_user=1"]
    assert main(args) == 2
    assert "is inside the input" in _one_error_line(capsys)
    assert sorted(p.name for p in events.iterdir()) == ["day1.csv"]  # nothing written beside the events


def test_prepare_output_beside_its_input_folder_or_input_file_still_works(tmp_path, capsys):
    events = _events_folder(tmp_path / "events")
    common = ["--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]
    assert main(["prepare", "--input", str(events), "--output", str(tmp_path / "events-prepared"), *common]) == 0
    assert main(["prepare", "--input", str(events / "day1.csv"), "--output", str(tmp_path / "p2"), *common]) == 0
    # a prepared dir's own events file, prepared again into the same dir, is one file: allowed
    assert main(["prepare", "--input", str(tmp_path / "p2" / "events.parquet"), "--output", str(tmp_path / "p2"),
                 *common]) == 0  # fmt: skip
    assert "prepared 12 events" in capsys.readouterr().out


def test_pipeline_output_inside_its_input_folder_is_refused(tmp_path, capsys):
    events = _events_folder(tmp_path / "events")
    args = ["pipeline", "--output", str(events / "run"), "--set", "generate.enabled=false",
            "--set", f"data.input={events}"]  # fmt: skip
    assert main(args) == 2
    assert "is inside the input" in _one_error_line(capsys)
    assert sorted(p.name for p in events.iterdir()) == ["day1.csv"]


def test_score_output_inside_a_raw_events_folder_is_refused_before_the_model_loads(tmp_path, capsys):
    events = _events_folder(tmp_path / "events")
    assert main(["score", "--model-uri", "runs:/nosuchrun/model", "--input", str(events),
                 "--output", str(events / "rankings")]) == 2  # fmt: skip
    assert "is inside the input" in _one_error_line(capsys)
    assert sorted(p.name for p in events.iterdir()) == ["day1.csv"]
    # a prepared dir is read by its file names: rankings inside it are not read back, so not refused
    prepared = tmp_path / "prepared"
    args = ["--set", "data.min_events_per_user=1", "--set", "data.min_events_per_item=1"]
    assert main(["prepare", "--input", str(events), "--output", str(prepared), *args]) == 0
    capsys.readouterr()
    main(["score", "--model-uri", "runs:/nosuchrun/model", "--input", str(prepared), "--output", str(prepared / "r")])
    assert "is inside the input" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "line"), [
    (["prepare", "--input", "a.csv", "--input", "b.csv", "--output", "p"],
     "error: --input given twice ('a.csv', then 'b.csv'); give it once: to read several inputs, put their files in "
     "one folder or name them with a glob (see recsys-alibi prepare --help)"),
    (["score", "--model-uri", "runs:/x/model", "--output", "r1", "--output", "r2"],
     "error: --output given twice ('r1', then 'r2'); give it once (see recsys-alibi score --help)"),
])  # fmt: skip
def test_a_flag_of_one_value_given_twice_is_refused_not_last_wins(tmp_path, monkeypatch, capsys, argv, line):
    # `prepare --input A --input B` prepared B alone, exit 0
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's usage error
        code = stop.code
    assert code == 2
    assert _one_error_line(capsys) == line
    assert os.listdir(tmp_path) == []


def test_a_set_key_given_twice_says_which_value_replaces_which(tmp_path, monkeypatch, capsys, caplog):
    # the later one wins (overrides laid over a base command), but no longer without a word
    monkeypatch.chdir(tmp_path)
    (tmp_path / "e.csv").write_text("user_id,item_id,timestamp\n1,10,1\n1,11,2\n2,10,3\n")
    argv = ["prepare", "--input", "e.csv", "--output", "p", "--set", "data.min_events_per_user=5",
            "--set", "data.min_events_per_item=1", "--set", "data.min_events_per_user=1"]
    assert main(argv) == 0
    assert "--set data.min_events_per_user given twice: 'data.min_events_per_user=1' replaces " \
           "'data.min_events_per_user=5'" in caplog.text
    assert capsys.readouterr().out.startswith("prepared 3 events, 2 users")


@pytest.mark.parametrize(("uri", "why"), [
    ("s3://bucket/model", "reading s3:// needs the module botocore, which is not installed"),
    ("gs://bucket/model", "reading gs:// needs the module google.cloud, which is not installed"),
    ("http://host/path", "MLflow reads no model from a web address"),
])  # fmt: skip
def test_a_model_uri_of_a_scheme_without_its_client_is_one_line(tmp_path, monkeypatch, capsys, uri, why):
    # s3:// and gs:// were a ModuleNotFoundError traceback; http:// said "not enough values to unpack"
    monkeypatch.chdir(tmp_path)
    assert main(["score", "--model-uri", uri, "--input", "x", "--output", "r"]) == 2
    assert _one_error_line(capsys).startswith(f"error: cannot load model '{uri}' ({why}) from the tracking store")


def test_a_model_folder_without_mlmodel_is_refused_before_a_store_is_made(tmp_path, monkeypatch, capsys):
    # a prepared folder given as --model-uri created mlflow.db here, then named it in the error
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "notamodel").mkdir()
    assert main(["score", "--model-uri", "notamodel", "--input", "notamodel", "--output", "r"]) == 2
    assert _one_error_line(capsys) == (
        "error: cannot load model 'notamodel': it is no MLflow model folder (no MLmodel file in it); give "
        "runs:/RUN_ID/model or models:/NAME/VERSION from `recsys-alibi train`, or the folder that holds MLmodel")
    assert sorted(os.listdir(tmp_path)) == ["notamodel"]


def test_a_pipeline_input_that_is_missing_is_named_as_the_pipeline_takes_it(tmp_path, monkeypatch, capsys):
    # it said "pass ... as --input", a flag pipeline does not take
    monkeypatch.chdir(tmp_path)
    argv = ["pipeline", "--output", "out", "--set", "generate.enabled=false", "--set", "data.input=../data/r.csv"]
    assert main(argv) == 2
    assert _one_error_line(capsys) == (
        "error: input not found: '../data/r.csv'; pass an existing file, directory or glob as data.input "
        "(--set data.input=PATH; a relative path is read from the working directory, not from the config's folder)")


def test_a_pipeline_appending_to_no_prepared_data_is_refused_before_it_generates(tmp_path, monkeypatch, capsys):
    # it generated events.parquet and items.parquet into a new output, then refused the append
    monkeypatch.chdir(tmp_path)
    assert main(["pipeline", "--output", "out", "--set", "data.append=true", "--set", "generate.users=20"]) == 2
    assert _one_error_line(capsys) == (
        "error: cannot append to out/prepared: it is not a prepared directory (no manifest.json); run the first "
        "day's pipeline without data.append (docs/scheduling.md)")
    assert not (tmp_path / "out").exists()


# break-config-s66 (findings 5, 6, 9, 10): one line, the right code, before any work
def test_a_non_scalar_yaml_key_is_a_user_error_in_the_pipeline(tmp_path, monkeypatch, capsys):
    # it was `error: pipeline failed: TypeError: unhashable type: 'list'`, exit 1
    monkeypatch.chdir(tmp_path)
    (tmp_path / "y11.yaml").write_text("? [a]\n: 1\n")
    assert main(["pipeline", "--config", "y11.yaml"]) == 2
    assert _one_error_line(capsys) == ("error: y11.yaml: invalid YAML at line 1, column 3: a mapping key must be a "
                                       "plain value (a name), not a list")
    assert os.listdir(tmp_path) == ["y11.yaml"]


@pytest.mark.parametrize(("uri", "line"), [
    ("runs:/0123456789abcdef0123456789abcdef", "error: cannot load model 'runs:/0123456789abcdef0123456789abcdef': "
     "runs:/RUN_ID names a run, not a model; give runs:/0123456789abcdef0123456789abcdef/model (the path "
     "`recsys-alibi train` logs the model at)"),
    ("runs:/0123456789abcdef0123456789abcdef/model/", "error: cannot load model "
     "'runs:/0123456789abcdef0123456789abcdef/model/': a model URI has no trailing '/'; give "
     "runs:/0123456789abcdef0123456789abcdef/model"),
    ("models:/ranker/3/", "error: cannot load model 'models:/ranker/3/': a model URI has no trailing '/'; give "
     "models:/ranker/3"),
])  # fmt: skip
def test_a_model_uri_without_the_model_path_or_with_a_trailing_slash_names_the_fix(tmp_path, monkeypatch, capsys, uri,
                                                                                   line):  # fmt: skip
    # MLflow's own text: "Not a proper runs:/ URI: runs:/." and "No such artifact: 'MLmodel'"
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--prepared", "p", "--model-uri", uri, "--output", "ev"]) == 2
    assert _one_error_line(capsys) == line
    assert os.listdir(tmp_path) == []


def test_a_registered_name_too_long_for_its_lock_file_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    # the version was registered, then `File name too long: ...mlflow.db.promotion-mmm....lock`
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert main(["pipeline", "--output", "out", "--set", f"tracking.registered_model={'m' * 231}"]) == 2
    assert _one_error_line(capsys) == (
        "error: invalid config at 'tracking.registered_model': a name of 231 characters makes the promotion lock file "
        "beside mlflow.db 256 bytes long, over the 255 bytes a file name may have; use a name of at most 230 characters")
    assert os.listdir(tmp_path) == []


def test_the_tracking_uri_set_and_overridden_by_the_environment_is_said(tmp_path, monkeypatch, capsys, caplog):
    # the --set lost without a word, and other.db was never created
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    argv = ["evaluate", "--prepared", "none", "--baseline", "popularity", "--set", "tracking.uri=sqlite:///other.db"]
    assert main(argv) == 2
    capsys.readouterr()
    assert "MLFLOW_TRACKING_URI=sqlite:///env.db overrides tracking.uri=sqlite:///other.db: the runs go to " \
           "sqlite:///env.db; unset MLFLOW_TRACKING_URI to use tracking.uri" in caplog.messages


def test_settings_a_command_does_not_use_are_said(tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)
    assert main(["pipeline", "--output", "out", "--set", "generate.users=50", "--set", "score.ray.actors=4"]) == 2
    capsys.readouterr()  # no data.input: refused; the settings it would not have used were said first
    assert caplog.messages[:2] == ["score.ray.actors: not used with score.engine=local (they set up --engine ray)",
                                   "generate.users: not used with generate.enabled=false (the pipeline reads data.input)"]


def test_prepare_names_the_config_key_its_missing_input_came_from(tmp_path, monkeypatch, capsys):
    # it said "pass ... as --input", though no --input was given
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rel.yaml").write_text("data: {input: gone.csv}\n")
    assert main(["prepare", "--config", "sub/rel.yaml", "--output", "p"]) == 2
    assert _one_error_line(capsys) == (
        "error: input not found: 'gone.csv'; pass an existing file, directory or glob as data.input (from the config, "
        "or --input PATH; a relative path is read from the working directory, not from the config's folder)")


@pytest.mark.parametrize(("stop", "code", "line"), [
    (KeyboardInterrupt, 130, "error: generate stopped by Ctrl-C (SIGINT) before it finished"),
    ("SIGTERM", 143, "error: generate stopped by SIGTERM before it finished"),
])  # fmt: skip
def test_ctrl_c_or_sigterm_outside_training_is_one_line_and_its_code(tmp_path, monkeypatch, capsys, stop, code, line):
    # Ctrl-C printed a KeyboardInterrupt traceback; SIGTERM ended the process with no line at all
    import signal

    from pipelines import cli

    def interrupted(config, args):
        if stop == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
        raise stop()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(cli.COMMANDS, "generate", interrupted)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["generate", "--output", "e.parquet"]) == code
    assert _one_error_line(capsys) == line
    assert signal.getsignal(signal.SIGTERM) is before  # the process's own handler again after the command


def test_a_sigterm_handler_set_over_the_command_s_keeps_it_from_raising(tmp_path, monkeypatch, capsys):
    # Lightning sets its own during a fit and calls the one it found: it stops the fit at a batch's end itself
    import signal

    from pipelines import cli

    calls = []

    def fitting(config, args):
        found = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda signum, frame: (calls.append(signum), found(signum, frame)))
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            signal.signal(signal.SIGTERM, found)
        return "fit stopped"

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(cli.COMMANDS, "generate", fitting)
    assert main(["generate", "--output", "e.parquet"]) == 0
    assert calls == [signal.SIGTERM] and capsys.readouterr().out == "fit stopped\n"


def test_export_under_a_launcher_runs_on_rank_0_only(tmp_path, monkeypatch, capsys):
    """break-dist-s66: `torchrun ... export` ran the whole export on every rank into one folder. A process of rank
    1 does nothing and says nothing (rank 0 exports); its exit is 0."""
    monkeypatch.setenv("RANK", "1")
    code = main(["export", "--model-uri", "runs:/nosuchrun/model", "--input", str(tmp_path / "in"),
                 "--output", str(tmp_path / "export")])  # fmt: skip
    out = capsys.readouterr()
    assert (code, out.out, out.err, (tmp_path / "export").exists()) == (0, "", "", False)
    monkeypatch.setenv("RANK", "0")  # rank 0 does the work: here, refuses the missing input
    assert main(["export", "--model-uri", "runs:/nosuchrun/model", "--input", str(tmp_path / "in"),
                 "--output", str(tmp_path / "export")]) == 2  # fmt: skip
