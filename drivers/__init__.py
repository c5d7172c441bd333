"""Hardware behind small interfaces: the STS3215 bus, the arms, cameras and the simulated follower.

- ``sts3215_table``   the servo's control table (addresses, sizes, EEPROM/SRAM, sign encodings)
- ``protocol``        Feetech protocol 0 packets (instruction and status), checksums
- ``feetech_bus``     the serial bus client: sync reads/writes, retries, counters
- ``calibration_io``  the calibration the servos hold: read, write, ``verify_against_servos``
- ``arm_interface``   the small interface the daemon's control loop sees (leader / follower)
- ``feetech_arm``     our SO-101 arm driver over a real (or emulated) serial bus
- ``cameras``         the camera interface, the virtual camera, and the ``Frame`` cameras publish
- ``camera_lerobot``  real cameras through LeRobot's camera classes: verified at open, reopened after an unplug
- ``camera_discovery`` the cameras plugged in: by-id paths, V4L2 modes, a snapshot (``so101d find-cameras``)
- ``camera_bandwidth`` what camera streams reserve on a USB 2 bus (``so101d doctor``)
- ``sim_protocol``    the ZeroMQ protocol spoken with a simulated follower (MuJoCo, LeIsaac)
- ``sim_follower``    the follower arm backed by a simulator over ``sim_protocol``
- ``leader_mapping``  the leader as a simulated follower sees it under ``[follower] sim_mapping``
- ``emulator/``       the STS3215 bus emulator on a pseudo-terminal ("try it without an arm")

Imports only ``calibration`` below it (``.ci/check_imports.py``).
"""
