"""Configuration: defaults, the documented example, errors that name the key."""

from __future__ import annotations

import dataclasses
import os
import stat
import tomllib
from pathlib import Path

import pytest

from daemon.config.settings import Config, ConfigError, config_from_dict, dump_toml, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "daemon" / "configs" / "so101d.example.toml"


def test_no_file_gives_defaults_with_leader_on_ttyacm0():
    cfg = load_config(None)
    assert cfg.leader.port == "/dev/ttyACM0"
    assert cfg.control.rate_hz == 100.0
    assert cfg.follower.kind == "feetech"


def test_example_documents_every_key_with_its_default():
    data = tomllib.loads(EXAMPLE.read_text())
    assert load_config(EXAMPLE) == Config()
    for section in dataclasses.fields(Config):
        if section.name in ("cameras", "arms"):  # tables of tables, shown commented out
            continue
        keys = {f.name for f in dataclasses.fields(getattr(Config(), section.name))}
        assert set(data.get(section.name, {})) == keys, f"[{section.name}] in the example differs from the dataclass"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"follower": {"prot": "/dev/x"}}, "follower.prot"),
        ({"folower": {}}, "folower"),
        ({"control": {"rate_hz": -5}}, "control.rate_hz"),
        ({"control": {"rate_hz": "fast"}}, "control.rate_hz"),
        ({"control": {"rate_hz": float("nan")}}, "control.rate_hz"),
        ({"safety": {"on_fault": "explode"}}, "safety.on_fault"),
        ({"safety": {"max_step_deg": 0}}, "safety.max_step_deg"),
        ({"follower": {"kind": "ur5"}}, "follower.kind"),
        ({"follower": {"torque_off_on_shutdown": "yes"}}, "follower.torque_off_on_shutdown"),
        ({"leader": {"baudrate": 1.5}}, "leader.baudrate"),
        ({"leader": {"id": ""}}, "leader.id"),
        ({"cameras": {"front": {"widht": 640}}}, "cameras.front.widht"),
        ({"cameras": {"front": {"width": 0}}}, "cameras.front.width"),
        ({"socket": {"mode": 0o7777}}, "socket.mode"),
        ({"control": 3}, "control"),
        ({"policy": {"backend": "lerobot-server", "server": "gpu-box"}}, "policy.server"),
        ({"policy": {"server": "gpu-box:grpc"}}, "policy.server"),
    ],
)
def test_bad_keys_and_values_name_the_key(data, key):
    with pytest.raises(ConfigError) as ei:
        config_from_dict(data)
    assert str(ei.value).startswith(key + ":"), str(ei.value)


def test_file_errors_name_file_and_key(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[follower]\nprot = "/dev/ttyACM1"\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: follower\.prot: unknown key"):
        load_config(p)
    p.write_text("[follower\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_ints_accepted_for_floats_and_cameras_parsed():
    cfg = config_from_dict({"control": {"rate_hz": 50}, "cameras": {"front": {"kind": "virtual", "width": 320}}})
    assert cfg.control.rate_hz == 50.0 and isinstance(cfg.control.rate_hz, float)
    assert cfg.cameras["front"].kind == "virtual" and cfg.cameras["front"].height == 480


def test_dump_round_trips(tmp_path):
    cfg = config_from_dict({"follower": {"port": '/tmp/x "y"'}, "cameras": {"wrist": {"kind": "virtual"}}})
    p = tmp_path / "c.toml"
    p.write_text(dump_toml(cfg))
    assert load_config(p) == cfg


def test_one_serial_port_for_both_arms_is_refused_naming_both_keys(tmp_path):
    with pytest.raises(
        ConfigError, match=r"leader\.port '/dev/ttyUSB0' and follower\.port '/dev/ttyUSB0' name the same"
    ):
        config_from_dict({"leader": {"port": "/dev/ttyUSB0"}, "follower": {"port": "/dev/ttyUSB0"}})
    device = tmp_path / "ttyACM7"
    device.touch()
    link = tmp_path / "so101-leader"
    link.symlink_to(device)
    with pytest.raises(ConfigError, match=rf"leader\.port.*follower\.port.*\(both are {device}\)"):
        config_from_dict({"leader": {"port": str(link)}, "follower": {"port": str(device)}})
    # a simulated follower has no serial port
    config_from_dict({"leader": {"port": "/dev/ttyUSB0"}, "follower": {"kind": "sim", "port": "/dev/ttyUSB0"}})
    # a hard link (what a bind mount looks like to stat) is the same file under another name
    hard = tmp_path / "bound-here"
    os.link(device, hard)
    with pytest.raises(ConfigError, match=r"name the same serial port \(both are the same file"):
        config_from_dict({"leader": {"port": str(hard)}, "follower": {"port": str(device)}})


def test_a_second_device_node_for_the_follower_port_is_refused(tmp_path):
    """A container's `--device /dev/ttyACM0:/dev/so101-leader` makes a second node, not a link."""
    import pty

    main_fd, sub_fd = pty.openpty()
    try:
        tty = os.ttyname(sub_fd)
        node = tmp_path / "leader-node"
        try:
            os.mknod(node, 0o600 | stat.S_IFCHR, os.stat(tty).st_rdev)
        except PermissionError:
            pytest.skip("mknod is not allowed here")
        with pytest.raises(ConfigError, match=r"name the same serial port \(both are device \d+:\d+\)"):
            config_from_dict({"leader": {"port": str(node)}, "follower": {"port": tty}})
        other_main, other_sub = pty.openpty()  # another device: accepted
        try:
            config_from_dict({"leader": {"port": str(node)}, "follower": {"port": os.ttyname(other_sub)}})
        finally:
            os.close(other_main)
            os.close(other_sub)
    finally:
        os.close(main_fd)
        os.close(sub_fd)


# -------------------------------------------------------------------------------------------------
# a bimanual configuration: two pairs in [arms.left] / [arms.right], parsed and checked
# -------------------------------------------------------------------------------------------------
BIMANUAL_TOML = """\
[leader]
id = "bi_leader"

[follower]
id = "bi_follower"

[arms.left]
leader_port = "/dev/so101-left-leader"
follower_port = "/dev/so101-left-follower"

[arms.right]
leader_port = "/dev/so101-right-leader"
follower_port = "/dev/so101-right-follower"
"""


def _bimanual() -> dict:
    return tomllib.loads(BIMANUAL_TOML)


def test_a_bimanual_configuration_names_both_pairs_with_lerobots_bi_ids(tmp_path):
    p = tmp_path / "bi.toml"
    p.write_text(BIMANUAL_TOML)
    cfg = load_config(p)
    assert cfg.bimanual and list(cfg.arms) == ["left", "right"]
    assert cfg.arms["right"].follower_port == "/dev/so101-right-follower"
    # LeRobot's BiSOLeader(id="bi_leader") calibrates its arms as bi_leader_left / bi_leader_right
    assert [(a.leader_id, a.follower_id) for a in cfg.arms.values()] == [
        ("bi_leader_left", "bi_follower_left"),
        ("bi_leader_right", "bi_follower_right"),
    ]
    data = _bimanual()
    data["arms"]["left"]["follower_id"] = "lab_follower_a"  # an id of its own is kept
    assert config_from_dict(data).arms["left"].follower_id == "lab_follower_a"
    q = tmp_path / "dumped.toml"
    q.write_text(dump_toml(cfg))
    assert load_config(q) == cfg
    assert not load_config(None).bimanual  # a single-arm configuration stays one pair


def _without(side: str, key: str) -> dict:
    data = _bimanual()
    del data["arms"][side][key]
    return data


def _with(side: str, key: str, value: str) -> dict:
    data = _bimanual()
    data["arms"][side][key] = value
    return data


@pytest.mark.parametrize(
    ("data", "key", "why"),
    [
        (_without("left", "follower_port"), "arms.left.follower_port", "missing"),
        (_with("right", "leader_port", ""), "arms.right.leader_port", "missing"),
        ({**_bimanual(), "arms": {"left": _bimanual()["arms"]["left"]}}, "arms.right", "names both pairs"),
        ({**_bimanual(), "arms": {**_bimanual()["arms"], "middle": {}}}, "arms.middle", "unknown pair"),
        ({"arms": {"left": {"leader_prot": "/dev/x"}}}, "arms.left.leader_prot", "unknown key"),
        ({**_bimanual(), "leader": {"port": "/dev/ttyACM0"}}, "leader.port", "names its ports in [arms.left]"),
        # the simulator's two arms drive the pairs: a serial follower port there is a real follower
        ({**_bimanual(), "follower": {"kind": "sim"}}, "arms.left.follower_port", "with follower.kind = 'sim'"),
        (_with("right", "follower_id", "bi_follower_left"), "arms.right.follower_id", "own calibration file"),
        (_with("left", "leader_id", "a/b"), "arms.left.leader_id", "without '/'"),
    ],
)
def test_a_bimanual_configuration_with_a_pair_incomplete_is_refused_naming_the_key(data, key, why):
    with pytest.raises(ConfigError) as ei:
        config_from_dict(data)
    assert str(ei.value).startswith(key + ":") and why in str(ei.value), str(ei.value)


def test_one_serial_port_for_two_arms_of_a_bimanual_rig_is_refused_naming_both_keys(tmp_path):
    with pytest.raises(ConfigError) as ei:
        config_from_dict(_with("right", "leader_port", "/dev/so101-left-follower"))
    assert str(ei.value).startswith(
        "arms.left.follower_port '/dev/so101-left-follower' and arms.right.leader_port '/dev/so101-left-follower' "
        "name the same serial port"
    ), str(ei.value)
    device = tmp_path / "ttyACM2"
    device.touch()
    link = tmp_path / "so101-right-follower"
    link.symlink_to(device)
    data = _with("left", "leader_port", str(device))
    data["arms"]["right"]["follower_port"] = str(link)
    with pytest.raises(
        ConfigError, match=rf"^arms\.left\.leader_port .* and arms\.right\.follower_port .*\(both are {device}\)"
    ):
        config_from_dict(data)


def test_so101d_run_refuses_the_remote_leader_on_a_bimanual_rig_saying_it_is_not_built(tmp_path, capsys):
    """Two pairs are driven, recorded and run a policy (tests/test_bimanual_daemon.py,
    test_bimanual_recording.py); the LeIsaac remote leader for them is not built yet: refused
    before any port opens, rather than publishing one arm."""
    import argparse

    from daemon.apps.commands import run as run_command

    p = tmp_path / "bi.toml"
    p.write_text(
        BIMANUAL_TOML + f'\n[socket]\npath = "{tmp_path / "control.sock"}"\n[leisaac_remote_leader]\nenabled = true\n'
    )
    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    assert run_command.run(parser.parse_args(["--config", str(p)])) == 2
    err = capsys.readouterr().err
    assert "cannot start" in err and "[leisaac_remote_leader] enabled with [arms.left]" in err, err
    assert "two arms" in err, err
    assert not (tmp_path / "control.sock").exists()  # refused before anything was opened


def test_so101d_doctor_does_not_check_default_ports_for_a_bimanual_configuration(tmp_path, capsys):
    """[leader] / [follower] hold no port there: a check of /dev/ttyACM0 would report on no arm of the rig."""
    import argparse

    from daemon.apps.commands import doctor

    p = tmp_path / "bi.toml"
    p.write_text(BIMANUAL_TOML)
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    assert doctor.run(parser.parse_args(["--config", str(p)])) == 2
    err = capsys.readouterr().err
    assert "bimanual configuration's four arms is not built yet" in err and "--leader PORT" in err, err
