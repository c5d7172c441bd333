"""Everything README.md names exists: the docs cannot drift from the code again.

A new user copies commands, keys and imports from the README. Each one is checked against the
real thing, never against a list kept here: `so101d ...` commands are parsed by the real parser
(daemon.apps.cli.build_parser), config keys are looked up in daemon.config.settings's dataclasses and in the
shipped example configuration, Python imports are imported, repository paths are stat'ed.
The last tests feed the checks the drifted lines issue #18 found, so they are known to catch them.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
import shlex
import tomllib
import typing

import pytest
from readme_support import (
    REPO,
    Command,
    ConfigKey,
    commands,
    config_keys,
    dotted_python_names,
    python_blocks,
    readme_text,
    repo_paths,
    snippets,
)

import daemon.config.settings as config_module
from daemon.apps.cli import build_parser

EXAMPLE_TOML = REPO / "daemon/configs/so101d.example.toml"


# ---------------------------------------------------------------------------------------------
# the real schema and parser
# ---------------------------------------------------------------------------------------------
def _schema() -> dict[str, set[str]]:
    """Section -> keys, from daemon.config.settings.Config's dataclasses ("cameras.*" for a camera table)."""
    hints = typing.get_type_hints(config_module.Config)
    out: dict[str, set[str]] = {}
    for name, tp in hints.items():
        if typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
            name = f"{name}.*"
        out[name] = {f.name for f in dataclasses.fields(tp)}
    return out


def _example() -> dict[str, set[str]]:
    """Section -> keys in the shipped example, the commented camera table included."""
    text = EXAMPLE_TOML.read_text()
    data = tomllib.loads(text)
    out = {section: set(values) for section, values in data.items() if isinstance(values, dict)}
    # The camera table is shown commented out (no camera by default): read it uncommented.
    m = re.search(r"^# \[cameras\.\w+\]\n((?:# [a-z_]+ = .*\n)+)", text, re.M)
    if m:
        body = "\n".join(line[2:] for line in m.group(1).splitlines())
        out["cameras.*"] = set(tomllib.loads(body))
    return out


def _key_problems(keys: list[ConfigKey]) -> list[str]:
    schema, example = _schema(), _example()
    problems = []
    for k in keys:
        section = "cameras.*" if k.section.startswith("cameras.") else k.section
        where = f"README.md:{k.line} ({k.how!r})"
        if not section:
            if not any(k.key in keys_ for keys_ in schema.values()):
                problems.append(f"{where}: '{k.key}' is not a configuration key in any section")
            continue
        if section not in schema:
            problems.append(f"{where}: no section [{k.section}] in daemon/config/settings.py")
        elif k.key not in schema[section]:
            problems.append(f"{where}: [{k.section}] has no key '{k.key}' in daemon/config/settings.py")
        elif k.key not in example.get(section, set()):
            problems.append(f"{where}: [{k.section}] {k.key} is missing from {EXAMPLE_TOML.relative_to(REPO)}")
    return problems


def _parse(argv: tuple[str, ...]) -> str | None:
    """None if the real parser accepts ``argv``, else its error message.

    A placeholder the README shows in capitals where a number goes (`--record N`, `--duration S`)
    is tried as 1.
    """
    args = list(argv)
    for _ in range(len(args) + 1):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser(args).parse_args(args)
                return None
            except SystemExit as exc:
                if exc.code in (0, None):
                    return None
        message = err.getvalue().strip().splitlines()[-1]
        placeholder = re.search(r"invalid (?:int|float) value: '([A-Z]+)'", message)
        if placeholder is None or placeholder.group(1) not in args:
            return message
        args[args.index(placeholder.group(1))] = "1"
    return message


def _command_problems(found: list[Command]) -> list[str]:
    problems = []
    for cmd in found:
        for argv in cmd.variants:
            if not argv:
                continue  # the program named in prose ("so101d runs as ...")
            error = _parse(argv)
            # An inline mention may name a command without its required arguments
            # ("`so101d import-hdf5` into a dataset ... refuses"): what it shows must still exist.
            if error and cmd.kind == "inline" and "arguments are required" in error:
                continue
            if error:
                problems.append(f"README.md:{cmd.line} `{cmd.text}` -> so101d {' '.join(argv)}: {error}")
    return problems


# ---------------------------------------------------------------------------------------------
# the README as it is
# ---------------------------------------------------------------------------------------------
def test_the_readme_shows_so101d_commands_at_all() -> None:
    found = commands()
    shown = {c.variants[0][0] for c in found if c.variants and c.variants[0]}
    # Guards the extractor itself: if it stopped finding commands every check below would pass.
    assert len(found) > 30
    assert {"demo", "run", "status", "calibrate", "emulate", "episode", "record", "sim-follower"} <= shown


def test_every_so101d_command_and_flag_in_the_readme_parses() -> None:
    assert _command_problems(commands()) == []


def test_every_subcommand_of_the_cli_is_in_the_readme() -> None:
    from daemon.apps.cli import COMMANDS

    shown = {c.variants[0][0] for c in commands() if c.variants and c.variants[0]}
    assert sorted(set(COMMANDS) - shown) == []


def test_every_config_key_in_the_readme_exists_in_the_schema_and_the_example() -> None:
    keys = config_keys(set(_schema()))
    assert len(keys) > 15  # the extractor still finds them
    assert _key_problems(keys) == []


def test_the_example_config_loads_with_every_key_of_the_schema() -> None:
    schema, example = _schema(), _example()
    assert {s: sorted(schema[s] - example.get(s, set())) for s in schema if schema[s] - example.get(s, set())} == {}
    config_module.load_config(EXAMPLE_TOML)  # and it loads as shipped


def test_every_python_import_in_the_readme_imports() -> None:
    blocks = python_blocks()
    assert blocks, "the README's Python snippets were not found"
    for code, line in blocks:
        tree = ast.parse(code, filename=f"README.md:{line}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    importlib.import_module(alias.name)
            elif isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(module, alias.name), f"README.md:{line}: {node.module} has no {alias.name}"


def test_every_dotted_python_name_in_the_readme_resolves() -> None:
    names = dotted_python_names()
    assert names
    for name, line in names:
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        else:
            pytest.fail(f"README.md:{line}: nothing of {name} imports")
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"README.md:{line}: {name}: no {attr}"
            obj = getattr(obj, attr)


def test_every_repository_path_in_the_readme_exists() -> None:
    paths = repo_paths()
    assert len(paths) > 20
    missing = [f"README.md:{line}: {path}" for path, line in paths if not (REPO / path).exists()]
    assert missing == []


# LeRobot's programs parse their flags with draccus from a config dataclass (no build_parser)
DRACCUS_CONFIGS = {"lerobot.async_inference.policy_server": "lerobot.async_inference.configs.PolicyServerConfig"}


def _resolve(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_python_modules_and_bench_scripts_the_readme_runs_exist_with_their_flags() -> None:
    seen = 0
    for s in snippets():
        for m in re.finditer(r"python -m ([\w.]+)((?: +--?\w[\w-]*(?: +[^\s\\-][^\s\\]*)?)*)", s.text):
            module, args = m.group(1), shlex.split(m.group(2))
            if module == "pytest":
                continue
            seen += 1
            assert importlib.util.find_spec(module) is not None, f"README.md:{s.line}: no module {module}"
            if module in DRACCUS_CONFIGS:  # LeRobot's own programs: flags are fields of their config
                config = _resolve(DRACCUS_CONFIGS[module])
                fields = {f.name for f in dataclasses.fields(config)}
                flags = {a.split("=", 1)[0].removeprefix("--") for a in args if a.startswith("--")}
                assert flags <= fields, f"README.md:{s.line}: {module} has no {sorted(flags - fields)}"
                continue
            mod = importlib.import_module(module)
            parser = mod.build_parser()
            _ns, unknown = parser.parse_known_args(args)
            # Isaac Lab's AppLauncher adds these at run time (isaaclab.app.AppLauncher
            # .add_app_launcher_args); it is only installed on the GPU workstation.
            unknown = [u for u in unknown if u not in ("--enable_cameras", "--device", "cuda", "--headless")]
            assert unknown == [], f"README.md:{s.line}: {module} does not know {unknown}"
        for m in re.finditer(r"python (bench/\w+\.py)((?: *\[?--[\w-]+(?: \d+)?\]?)*)", s.text):
            script = REPO / m.group(1)
            seen += 1
            assert script.is_file(), f"README.md:{s.line}: no {m.group(1)}"
            for flag in re.findall(r"--[\w-]+", m.group(2)):
                assert f'"{flag}"' in script.read_text(), f"README.md:{s.line}: {m.group(1)} has no {flag}"
    assert seen >= 4


def test_make_targets_the_readme_names_exist() -> None:
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    shown = set(re.findall(r"`?make (\w+)", readme_text()))
    assert shown and shown <= targets


# ---------------------------------------------------------------------------------------------
# the checks catch the drift issue #18 found (README lines as they were)
# ---------------------------------------------------------------------------------------------
DRIFTED = """\
For jitter under 1 ms on a busy machine set `control.realtime_priority = 50` (needs LimitRTPRIO).
- Real adapters: set the FTDI latency timer to 1 ms (udev, `so101d find-ports`), then
  lower `reply_margin_s` for faster fault detection.
- `so101d episode save --sucess`, `[follower] kind = "sim" endpont = "tcp://127.0.0.1:5555"`

    so101d sim-follower --backend bullet
"""


def test_the_checks_catch_a_key_that_does_not_exist() -> None:
    problems = _key_problems(config_keys(set(_schema()), DRIFTED))
    assert any("'reply_margin_s' is not a configuration key" in p for p in problems)
    assert any("[follower] has no key 'endpont'" in p for p in problems)


def test_the_checks_catch_a_flag_or_choice_that_does_not_exist() -> None:
    problems = _command_problems(commands(DRIFTED))
    assert any("--sucess" in p for p in problems)
    assert any("bullet" in p for p in problems)


def test_the_realtime_priority_the_readme_suggests_is_what_the_drop_in_allows() -> None:
    conf = (REPO / "systemd/so101d.service.d/realtime.conf").read_text()
    allowed = int(re.search(r"^LimitRTPRIO=(\d+)", conf, re.M).group(1))  # type: ignore[union-attr]
    suggested = [int(v) for v in re.findall(r"realtime_priority = (\d+)", readme_text())]
    assert suggested and all(0 < v <= allowed for v in suggested)
    assert [int(v) for v in re.findall(r"realtime_priority = (\d+)", DRIFTED)] == [50]  # would fail


def test_the_calibration_steps_are_the_prompts_the_cli_shows() -> None:
    cli = (REPO / "daemon/apps/commands/calibrate.py").read_text()
    prompts = re.findall(r'"(\d)/(\d) ', cli)
    total = int(prompts[0][1])
    assert [int(p[0]) for p in prompts] == list(range(1, total + 1))
    section = readme_text().split("### Calibrating an arm")[1].split("\n### ")[0]
    steps = re.findall(r"^(\d)\. ", section, re.M)
    assert [int(s) for s in steps] == list(range(1, total + 1))
    assert f"`1/{total}` ... `{total}/{total}`" in section


def test_the_emulators_calibration_ids_are_the_ones_the_readme_names() -> None:
    import argparse

    from drivers.emulator import cli as emulate_cli

    p = argparse.ArgumentParser()
    emulate_cli.add_arguments(p)
    defaults = p.parse_args([])
    section = readme_text().split("### No arm?")[1].split("\n### ")[0]
    assert f"`{defaults.leader_id}`" in section and f"`{defaults.follower_id}`" in section
    assert f'[leader] id = "{defaults.leader_id}"' in section
    assert f'[follower] id = "{defaults.follower_id}"' in section
