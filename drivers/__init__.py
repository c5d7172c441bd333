"""Hardware behind small interfaces: the STS3215 bus, the arms, cameras and the simulated follower.

- ``sts3215_table``   the servo's control table (addresses, sizes, EEPROM/SRAM, sign encodings)
- ``protocol``        Feetech protocol 0 packets (instruction and status), checksums
- ``feetech_bus``     the serial bus client: sync reads/writes, retries, counters
- ``calibration_io``  the calibration the servos hold: read, write, ``verify_against_servos``
- ``arm_interface``   the small interface the daemon's control loop sees (leader / follower)
- ``feetech_arm``     our SO-101 arm driver over a real (or emulated) serial bus
- ``cameras``         real (OpenCV), virtual and simulated cameras, and the ``Frame`` they publish
- ``sim_protocol``    the ZeroMQ protocol spoken with a simulated follower (MuJoCo, LeIsaac)
- ``sim_follower``    the follower arm backed by a simulator over ``sim_protocol``
- ``leader_mapping``  the leader as a simulated follower sees it under ``[follower] sim_mapping``
- ``emulator/``       the STS3215 bus emulator on a pseudo-terminal ("try it without an arm")

Imports only ``calibration`` below it (``.ci/check_imports.py``).
"""
