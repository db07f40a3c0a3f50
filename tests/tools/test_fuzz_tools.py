"""Fuzzing the tools' command lines and the files they read (docs/reliability.md, "Bad input"): generated bad
arguments of ``python -m tvq_exp.bench`` and ``python -m tvq_exp.analysis`` (report, ``frontier``, ``study``),
hostile study files, result files and run dirs. Each is refused with a non-zero exit and one ``error:`` line naming
the value, before anything runs; no traceback, nothing accepted silently, nothing written outside ``--out``.

Cases are generated per option from the rule it breaks (zero, negative, non-finite, not a number, a path where a
name belongs, a folder or device where a file belongs) and per file from the ways it can lie (``../`` names,
``!!python`` tags, keys the runner owns, wrong types, damaged bytes)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tvq_exp import analysis, bench

RNG = random.Random(41)
NUMBERS = {  # option -> bad values (the rule each breaks is in the message)
    "--reps": ["0", "-1", "1.5", "abc", "nan", "inf", ""],
    "--budget": ["-1", "nan", "inf", "-inf", "abc"],
    "--timeout": ["0", "-1", "nan", "inf", "abc"],
    "--threads": ["-1", "abc", "1.5"],
    "--mm-size": ["0", "-1", "abc"],
    "--mem-limit-mb": ["-1", "nan", "inf", "abc"],
    "--lengths": ["0", "-5", "abc", "64,-1", "1e3"],
}
SAFE = {
    "attention": ["--backends", "dense", "--mode", "fwd", "--lengths", "16", "--reps", "1", "--budget", "0",
                  "--mm-size", "8", "--timeout", "30", "--threads", "1"],
    "model": ["--models", "gau_dense", "--mode", "fwd", "--lengths", "16", "--reps", "1", "--budget", "0",
              "--mm-size", "8", "--timeout", "30", "--threads", "1", "--d-model", "16", "--n-layers", "1"],
}  # fmt: skip
MODEL_NUMBERS = {"--d-model": ["0", "-1", "abc", "1.5"], "--n-layers": ["0", "-3", "abc"]}


def _refusal(call: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> str:
    """The one ``error:`` line ``call`` exits with (from its exit code or stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        call()
    code = exit_info.value.code
    assert code not in (0, None), "exited 0: accepted silently"
    err = capsys.readouterr().err.strip()
    message = str(code) if isinstance(code, str) else err.splitlines()[-1]
    assert message.startswith("error: ") and "\n" not in message and "Traceback" not in err, message
    return message


def _bench_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    """(argv, a text the refusal must hold)."""
    folder = tmp_path / "a_folder"
    folder.mkdir(exist_ok=True)
    link = tmp_path / "link.png"
    link.unlink(missing_ok=True)
    link.symlink_to(tmp_path / "elsewhere.png")
    cases: list[tuple[list[str], str]] = []
    for command in ("attention", "model"):
        numbers = {**NUMBERS, **(MODEL_NUMBERS if command == "model" else {})}
        cases += [
            ([command, option, value], option) for option, values in numbers.items() for value in values
        ]
        cases += [
            ([command, "--plot", str(folder)], str(folder)),  # would write a_folder.png
            ([command, "--plot", str(tmp_path / "plot")], "ending in .png"),
            ([command, "--plot", "/dev/null"], "/dev/null"),
            ([command, "--plot", str(link)], str(link)),
            ([command, "--json", str(folder)], str(folder)),
            ([command, "--json", "/dev/full"], "/dev/full"),
            ([command, "--json", str(tmp_path / "records.txt")], "ending in .json"),
            ([command, "--json", "/sys/tvq.json"], "/sys"),  # a folder that takes no file
            ([command, "--device", "tpu"], "tpu"),
            ([command, "--dtype", "fp8"], "fp8"),
            ([command, "--mode", "sideways"], "sideways"),
            ([command, "--no-such-option", "1"], "--no-such-option"),
        ]
    cases += [(["attention", "--backends", name], name) for name in ("nope", "../dense", "DENSE", ",")]
    cases += [
        (["model", "--models", name], name) for name in ("nope", "../gau_vq", "gau_vq@nope", "/etc/passwd")
    ]
    cases += [(["model", "--set", item], item) for item in ("noequals", "=1", "gau_dense:")]
    # a cheap configuration first (the case's value, given last, wins): a case accepted by mistake runs in seconds
    cases = [([argv[0], *SAFE[argv[0]], *argv[1:]], words) for argv, words in cases]
    return [*cases, ([], "command"), (["sideways"], "sideways")]


def test_generated_bad_bench_arguments_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _bench_cases(tmp_path)
    assert len(cases) >= 100
    for argv, words in cases:
        message = _refusal(lambda argv=argv: bench.main(argv), capsys)
        assert words in message, (argv, message)
    assert [p.name for p in tmp_path.glob("*.png")] == ["link.png"] and not (
        tmp_path / "elsewhere.png"
    ).exists()
    assert not Path("/dev/null.png").exists()


def _frontier_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    afile = tmp_path / "a_file"
    afile.write_text("x")
    out = ["--out", str(tmp_path / "frontier")]
    cases = [([f"--budget={value}", *out], value) for value in ("-1", "0", "nan", "inf", "-inf", "abc", "")]
    models = ("../x", "a/b", "nope", ".hidden", ",", "gau_vq,../x")
    cases += [(["--models", value, *out], value.rpartition(",")[2] or value) for value in models]
    cases += [([*out, item], item) for item in ("hydra.run.dir=/tmp/x", "paths.log_dir=/x", "novalue")]
    cases += [(["--out", str(afile)], str(afile)), (["--out", "/sys/tvq"], "/sys/tvq")]
    safe = [
        "--budget",
        "1",
        "--models",
        "gau_vq",
    ]  # first (the case's value wins): a mistake trains for seconds
    return [(["frontier", *safe, *argv], words) for argv, words in cases]


def test_generated_bad_frontier_arguments_are_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = _frontier_cases(tmp_path)
    for argv, words in cases:
        message = _refusal(lambda argv=argv: analysis.main(argv), capsys)
        assert words in message, (argv, message)
    assert not (tmp_path / "frontier" / "runs").exists(), "a frontier run started"


GOOD_STUDY = {
    "name": "s",
    "base": ["experiment=smoke"],
    "regimes": {"r": []},
    "runs": {"a": {"overrides": ["model=gau_vq"], "seeds": [1]}},
    "evaluate": [{"name": "test", "split": "test"}],
}


def _yaml(value: object) -> str:
    import yaml

    return yaml.safe_dump(value)


def _study_files(folder: Path) -> list[tuple[str, Path, str]]:
    """(case, study file, a text the refusal must hold)."""

    def variant(change: Callable[[dict], None]) -> str:
        import copy

        spec = copy.deepcopy(GOOD_STUDY)
        change(spec)
        return _yaml(spec)

    texts: list[tuple[str, str, str]] = [
        (
            "python tag",
            "name: !!python/object/apply:os.system ['touch victim']\nruns: {}\nevaluate: []\n",
            "not plain YAML",
        ),
        (
            "python tag deep",
            _yaml(GOOD_STUDY).replace("experiment=smoke", "!!python/name:os.system"),
            "not plain YAML",
        ),
        ("syntax", "name: [unclosed\n", "not plain YAML"),
        ("not utf-8", "name: caf\xe9\n", "not plain YAML"),
        ("a list", "- 1\n- 2\n", "a study is a mapping"),
        ("empty", "", "a study needs 'name'"),
        ("unknown key", variant(lambda s: s.update(extra=1)), "unknown key 'extra'"),
        ("runs a list", variant(lambda s: s.update(runs=["a"])), "runs must be a mapping"),
        ("evaluate a dict", variant(lambda s: s.update(evaluate={"name": "x"})), "evaluate must be a list"),
        ("seeds text", variant(lambda s: s["runs"]["a"].update(seeds=["1"])), "seeds=['1']"),
        ("seeds negative", variant(lambda s: s["runs"]["a"].update(seeds=[-1])), "seeds=[-1]"),
        ("seeds a bool", variant(lambda s: s["runs"]["a"].update(seeds=[True])), "seeds=[True]"),
        (
            "overrides a dict",
            variant(lambda s: s["runs"]["a"].update(overrides={"a": 1})),
            "list of overrides",
        ),
        ("unknown run key", variant(lambda s: s["runs"]["a"].update(path="x")), "unknown key 'path'"),
        (
            "unknown regime",
            variant(lambda s: s["runs"]["a"].update(regimes=["zz"])),
            "unknown regimes ['zz']",
        ),
        (
            "eval option a dict",
            variant(lambda s: s["evaluate"][0].update(split={"a": 1})),
            "must be a plain value",
        ),
    ]
    for bad in ("../x", "a/b", ".hidden", "a--b", "", "/abs", "..", "x/../../y", "a b"):
        texts.append(
            (f"run {bad!r}", variant(lambda s, b=bad: s["runs"].update({b: {"seeds": [1]}})), repr(bad))
        )
        texts.append((f"regime {bad!r}", variant(lambda s, b=bad: s["regimes"].update({b: []})), repr(bad)))
        texts.append(
            (f"evaluation {bad!r}", variant(lambda s, b=bad: s["evaluate"].append({"name": b})), repr(bad))
        )
    for item in ("hydra.run.dir=/tmp/x", "+hydra.job.chdir=true", "paths.log_dir=/x", "run_name=../x",
                 "ckpt_path=/x.ckpt", "resume=never", "paths.output_dir=/tmp"):  # fmt: skip
        where = RNG.choice(["base", "regime", "run"])
        if where == "base":
            text = variant(lambda s, i=item: s["base"].append(i))
        elif where == "regime":
            text = variant(lambda s, i=item: s["regimes"]["r"].append(i))
        else:
            text = variant(lambda s, i=item: s["runs"]["a"]["overrides"].append(i))
        texts.append((f"{item} in {where}", text, item))
    for key, value in (("output", "/etc/x.json"), ("ckpt_path", "/x.ckpt"), ("hydra.run.dir", "/tmp")):
        texts.append((f"eval {key}", variant(lambda s, k=key, v=value: s["evaluate"][0].update({k: v})), key))
    cases = []
    for i, (name, text, words) in enumerate(texts):
        path = folder / f"study-{i}.yaml"
        path.write_bytes(text.encode("latin-1") if name == "not utf-8" else text.encode())
        cases.append((name, path, words))
    return cases


def test_generated_bad_study_files_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cases = _study_files(tmp_path)
    assert len(cases) >= 45
    out = tmp_path / "study"
    for action in ("run", "report"):
        for name, path, words in cases:
            argv = ["study", action, str(path), "--out", str(out)]
            message = _refusal(lambda argv=argv: analysis.main(argv), capsys)
            assert words in message and str(path) in message, (name, message)
    assert not (tmp_path / "victim").exists() and not out.exists()


def test_generated_bad_study_arguments_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = tmp_path / "good.yaml"
    study.write_text(_yaml(GOOD_STUDY))
    out = ["--out", str(tmp_path / "s")]
    cases = [([*out, "--parallel", v], v) for v in ("0", "-1", "abc", "1.5")]
    cases += [([*out, "--cores", v], v) for v in ("0", "-2", "x")]
    cases += [([*out, "--seeds", v], v) for v in ("abc", "-1", "1.5", "1,x")]
    cases += [([*out, "--runs", "nope"], "nope"), ([*out, "--regimes", "../r"], "../r")]
    cases += [(["--out", "/sys/tvq-study"], "/sys/tvq-study")]
    for argv, words in cases:
        message = _refusal(lambda argv=argv: analysis.main(["study", "run", str(study), *argv]), capsys)
        assert words in message, (argv, message)
    message = _refusal(lambda: analysis.main(["study", "sideways", str(study), *out]), capsys)
    assert "sideways" in message
    assert not (tmp_path / "s").exists()


def _result_files() -> list[tuple[str, bytes, str]]:
    good = {"id": "a--r--s1", "run": "a", "regime": "r", "seed": 1, "config": {}, "evaluations": {"test": {}}}

    def changed(**items: object) -> bytes:
        import json

        return json.dumps({**good, **items}).encode()

    cases = [
        ("garbage", bytes(RNG.randbytes(200)), "not a JSON result file"),
        ("truncated", changed()[:40], "not a JSON result file"),
        ("a list", b"[1, 2]", "a JSON object"),
        ("seed text", changed(seed="1"), "seed='1'"),
        ("evaluations a list", changed(evaluations=["test"]), "evaluations must map"),
    ]
    for bad in ("../x", "/abs/x", "a/b", ".hidden", "", "../../../../tmp/evil"):
        cases.append((f"run {bad!r}", changed(run=bad), repr(bad)))
        cases.append((f"regime {bad!r}", changed(regime=bad), repr(bad)))
        cases.append((f"evaluation {bad!r}", changed(evaluations={bad: {"bpb": 1.0}}), repr(bad)))
        cases.append((f"id {bad!r}", changed(id=bad), repr(bad)))
    return cases


def test_generated_bad_result_files_are_refused_and_nothing_is_written_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = tmp_path / "good.yaml"
    study.write_text(_yaml(GOOD_STUDY))
    cases = _result_files()
    assert len(cases) >= 25
    for name, data, words in cases:
        out = tmp_path / "s"
        (out / "results").mkdir(parents=True, exist_ok=True)
        bad = out / "results" / "a--r--s1.json"
        bad.write_bytes(data)
        argv = ["study", "report", str(study), "--out", str(out), "--figures", str(out / "figures")]
        message = _refusal(lambda argv=argv: analysis.main(argv), capsys)
        assert words in message and str(bad) in message, (name, message)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["good.yaml", "s/results/a--r--s1.json"], written


def _damaged_runs(folder: Path) -> list[tuple[str, Path, str]]:
    """(case, a sweep holding one damaged run beside a good one, a text the refusal must hold)."""
    cases = []

    def sweep(name: str) -> tuple[Path, Path]:
        root = folder / name
        for run in ("good", "bad"):
            (root / run / ".hydra").mkdir(parents=True)
            (root / run / "config.yaml").write_text("model: {d_model: 8}\n")
            (root / run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
        return root, root / "bad"

    yaml_payloads = [
        "model: !!python/object/apply:os.system ['touch victim']\n",
        "!!python/name:os.system\n",
        "a: !!python/object/new:pathlib.Path ['x']\n",
        "a: [unclosed\n",
    ]
    for i, text in enumerate(yaml_payloads):
        root, bad = sweep(f"config-{i}")
        (bad / "config.yaml").write_text(text)
        cases.append((f"config.yaml {text[:20]!r}", root, "config.yaml is not plain YAML"))
        root, bad = sweep(f"overrides-{i}")
        (bad / ".hydra" / "overrides.yaml").write_text(text)
        cases.append((f"overrides.yaml {text[:20]!r}", root, "overrides.yaml is not plain YAML"))
    root, bad = sweep("latin1")
    (bad / "config.yaml").write_bytes("a: caf\xe9\n".encode("latin-1"))
    cases.append(("config.yaml not utf-8", root, "config.yaml is not plain YAML"))
    for i, size in enumerate((5, 100, 5000)):
        root, bad = sweep(f"events-{i}")
        (bad / "tensorboard").mkdir()
        (bad / "tensorboard" / "events.out.tfevents.1.host").write_bytes(RNG.randbytes(size))
        cases.append((f"garbage event file of {size} bytes", root, "events.out.tfevents.1.host"))
    for i, target in enumerate(("/etc", "/etc/hostname")):
        root, bad = sweep(f"link-{i}")
        (bad / "tensorboard").symlink_to(target)
        cases.append((f"link to {target}", root, "is a symbolic link"))
    return cases


def test_damaged_run_dirs_are_never_reported_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = _damaged_runs(tmp_path)
    for name, sweep, words in cases:
        out = tmp_path / f"report-{sweep.name}"
        message = _refusal(
            lambda sweep=sweep, out=out: analysis.main([str(sweep), "--out", str(out)]), capsys
        )
        assert "1 of 2 runs are damaged" in message and words in message, (name, message)
        assert "damaged: " in (out / "summary.md").read_text()
    assert not (tmp_path / "victim").exists()
    for argv, words in (([str(tmp_path / "none"), "--out", str(tmp_path / "o")], "no such folder"),
                        ([str(cases[0][1]), "--out", str(tmp_path / "good.txt")], "good.txt")):  # fmt: skip
        (tmp_path / "good.txt").write_text("a file, not a folder")
        assert words in _refusal(lambda argv=argv: analysis.main(argv), capsys)


def test_a_bench_with_a_failed_configuration_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A configuration whose worker fails (here: an option the model does not have) is recorded, the records are
    written, and the command exits non-zero naming it; being out of memory or too slow is a measurement."""
    out = tmp_path / "records.json"
    argv = [*SAFE["model"], "--set", "gau_dense:block.no_such_option=1", "--json", str(out)]
    message = _refusal(lambda: bench.main(["model", *argv]), capsys)
    assert message.startswith("error: 1 of 1 configurations failed (gau_dense fwd T=16)"), message
    (record,) = json.loads(out.read_text())
    assert record["error"].startswith("worker failed")
